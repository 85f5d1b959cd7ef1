"""Devices (`annotated_transformer.lib.devices`): where bfloat16 is native, and so the default."""

import pytest
import torch


def test_bf16_is_supported_where_the_cpu_has_its_instructions(tmp_path):
    from annotated_transformer.lib.devices import bf16_supported

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\n")
    assert bf16_supported("cpu", cpuinfo)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert not bf16_supported("cpu", cpuinfo)
    assert not bf16_supported("cpu", tmp_path / "missing") and not bf16_supported("meta")


@pytest.mark.parametrize("capability, native", [((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_bf16_is_supported_on_gpus_that_compute_in_it_not_those_that_emulate_it(capability, native, monkeypatch):
    "A T4 (7.5) emulates bf16, slower than its float32; Ampere (8.0) and later have it in their tensor cores."
    from annotated_transformer.lib.devices import bf16_supported

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert bf16_supported("cuda:0") is native


def test_training_autocasts_to_bf16_by_default_wherever_the_device_computes_in_it(monkeypatch):
    from annotated_transformer.lib import devices

    for native in (True, False):
        monkeypatch.setattr(devices, "bf16_supported", lambda device, native=native: native)
        assert devices.bf16_by_default("cpu") is native and devices.bf16_by_default("cuda:0") is native
