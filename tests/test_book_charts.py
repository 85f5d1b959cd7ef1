"""The book's charts (book/_ext/book_charts.py): deterministic offline HTML with the pinned JavaScript, a picture
beside every chart, vendoring checked against its checksums, tables and SVG text."""

import base64
import hashlib
import io
import json
import re
import sys
import tarfile
from pathlib import Path
from xml.etree import ElementTree

import altair as alt
import pytest
import yaml
from _ext import book_charts as charts
from _ext.book_charts import (
    CHART_SCRIPTS,
    JS_ASSETS,
    book_renderer,
    chart_html,
    chart_png,
    plot_metrics,
    svg_text,
    use_book_charts,
    vendor_javascript,
)

ROOT = Path(__file__).resolve().parents[1]


SPEC = {"mark": "point", "data": {"values": [{"x": 1}]}, "encoding": {"x": {"field": "x", "type": "quantitative"}}}


def embedded_spec(html: str) -> dict:
    "The spec passed to the drawing function at the end of the chart's script."
    call = html.rsplit("})(", 1)[1].rsplit(");", 1)[0]
    return json.loads("[" + call + "]")[0]


def test_chart_html_is_deterministic_and_carries_the_spec():
    html = chart_html(SPEC)
    assert html == chart_html(json.loads(json.dumps(SPEC)))
    assert embedded_spec(html) == SPEC
    assert chart_html({**SPEC, "mark": "bar"}) != html


def test_a_closing_script_tag_inside_the_spec_cannot_end_the_script():
    spec = {**SPEC, "title": "</script><script>alert(1)</script>"}
    html = chart_html(spec)
    assert html.count("</script>") == 1
    assert embedded_spec(html)["title"] == spec["title"]


def test_outside_the_book_the_same_pinned_versions_are_fetched():
    html = chart_html(SPEC)
    for name in ("vega", "vega-lite", "vega-embed"):
        assert f"/{name}@{JS_ASSETS[name][0]}/build/{name}.min.js" in html


@pytest.fixture
def restore_renderer():
    active = alt.renderers.active
    yield
    alt.renderers.enable(active)


def test_altair_charts_render_through_the_book_renderer(restore_renderer):
    use_book_charts()
    chart = alt.Chart(alt.Data(values=[{"a": 1}])).mark_bar().encode(x="a:Q")
    bundle = chart._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    assert set(bundle) == {"text/html", "image/png", "text/plain"}
    assert embedded_spec(bundle["text/html"])["mark"] == {"type": "bar"}
    assert bundle == book_renderer(chart.to_dict())


def test_every_chart_carries_a_picture_of_itself():
    "A PNG of the chart, drawn from the same spec, for viewers that run no JavaScript."
    png = base64.b64decode(book_renderer(SPEC)["image/png"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png == chart_png(SPEC)
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # the IHDR chunk
    assert 20 < width < 2000 and 20 < height < 2000
    assert chart_png({**SPEC, "mark": "bar"}) != png


def stored_charts() -> list[tuple[str, dict]]:
    "(notebook and cell, output data) of every chart stored in the notebooks' outputs."
    found = []
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for output in cell.get("outputs", []):
                html = output.get("data", {}).get("text/html", "")
                if "at-chart" in "".join(html):
                    found.append((f"{path.name} cell {cell['id']}", output["data"]))
    return found


def test_every_stored_chart_has_a_static_image_beside_it():
    charts_found = stored_charts()
    assert len(charts_found) >= 10  # the book's charts: positions, attention, training curves, the heads
    missing = [where for where, data in charts_found if "image/png" not in data]
    assert missing == [], f"charts without a picture (re-run the cell with use_book_charts()): {missing}"


def test_the_book_loads_exactly_the_vendored_files():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    assert tuple(config["html_js_files"]) == CHART_SCRIPTS
    assert config["html_static_path"] == ["_build/vendor"]
    for path in (*CHART_SCRIPTS, config["mathjax_path"]):
        name, inside = path.split("/", 1)
        assert any(inside == w or (w.endswith("/") and inside.startswith(w)) for w in JS_ASSETS[name][2]), path
    assert not (ROOT / "_static").exists(), "Jupyter Book would add every .js under _static/ to every page"


def test_the_readme_lists_the_vendored_javascript_with_its_pinned_versions():
    "The README's table (| library | version | licence |) names every package of JS_ASSETS, at its pinned version."
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = re.search(r"^\| library \| version \| licence \|\n\|[-|]+\|\n((?:\|.*\|\n)+)", readme, flags=re.M)
    assert table, "README.md has no table | library | version | licence |"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.group(1).splitlines()]
    assert all(len(row) == 3 and row[2] for row in rows), rows  # every library has its licence
    listed = {library.lower(): version for library, version, _ in rows}
    assert listed == {name: version for name, (version, _, _) in JS_ASSETS.items()}


def fake_package(files: dict) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo("package/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def registry(tmp_path, monkeypatch):
    "A local npm-style registry with one package, `fake`, and JS_ASSETS pointing at it."
    data = fake_package({"LICENSE": "BSD", "build/fake.min.js": "var fake = 1;", "src/unwanted.js": "nope"})
    folder = tmp_path / "registry" / "fake" / "-"
    folder.mkdir(parents=True)
    (folder / "fake-1.0.0.tgz").write_bytes(data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    monkeypatch.setattr(charts, "JS_ASSETS", {"fake": ("1.0.0", integrity, ("LICENSE", "build/"))})
    return (tmp_path / "registry").as_uri(), folder / "fake-1.0.0.tgz"


def test_vendor_fetches_checks_and_keeps_only_the_listed_files(tmp_path, registry):
    url, tarball = registry
    dest = vendor_javascript(tmp_path / "vendor", url, quiet=True)
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["fake/.version", "fake/LICENSE", "fake/build/fake.min.js"]
    tarball.unlink()  # already there: a second run must not download again
    vendor_javascript(dest, url, quiet=True)


def test_vendor_refuses_a_tarball_that_does_not_match_its_checksum(tmp_path, registry):
    url, tarball = registry
    tarball.write_bytes(fake_package({"LICENSE": "BSD", "build/fake.min.js": "var evil = 1;"}))
    dest = tmp_path / "vendor"
    with pytest.raises(RuntimeError, match="checksum"):
        vendor_javascript(dest, url, quiet=True)
    assert list(dest.iterdir()) == []  # nothing unpacked, no temporary leftovers


def test_vendor_explains_an_unreachable_registry(tmp_path, registry):
    with pytest.raises(RuntimeError, match="could not download"):
        vendor_javascript(tmp_path / "vendor", (tmp_path / "nowhere").as_uri(), quiet=True)


def test_markdown_table_is_a_table_with_a_row_per_dict():
    from _ext.book_charts import markdown_table

    table = markdown_table([{"heads": 1, "BLEU": 21.4213}, {"heads": 8, "BLEU": 19.6}]).data.splitlines()
    assert table == ["| heads | BLEU |", "|---|---|", "| 1 | 21.42 |", "| 8 | 19.60 |"]


def test_svg_text_sets_sub_and_superscripts_as_the_paper_does():
    element = ElementTree.fromstring(svg_text(10, 20, "W^O and d_{model} < 2 & d_k", size=10, anchor="start"))
    place = (element.tag, element.get("x"), element.get("y"), element.get("text-anchor"))
    assert place == ("text", "10", "23.5", "start")  # y + 0.35 size: centred on y
    spans = [(span.text, span.get("dy"), span.get("font-size")) for span in element]
    assert spans == [
        ("W", None, None),
        ("O", "-6", "7.2"),
        (" and d", "6", None),
        ("model", "4", "7.2"),
        (" < 2 & d", "-4", None),
        ("k", "4", "7.2"),
    ]
    assert "".join(element.itertext()) == "WO and dmodel < 2 & dk"
    plain = ElementTree.fromstring(svg_text(0, 0, "Add & Norm", bold=True))
    assert [span.text for span in plain] == ["Add & Norm"] and plain.get("font-weight") == "bold"


def test_plot_metrics_without_matplotlib_says_which_extra_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'annotated-transformer\[book\]'"):
        plot_metrics(tmp_path)
