"""Figure 1, the architecture, drawn by code in the model chapter (book/05_model.ipynb) and shown on the landing page.

The chapter draws the figure as SVG from a `TransformerConfig` in a folded cell and stores the output under the glue
name `architecture`; book/index.md pastes that output (MyST-NB's `{glue}` directive with `:doc:`). nbval proves the
stored drawing is what the code draws; these tests check that the drawing follows the configuration, that the
landing page asks for the output the chapter stores, and, once the book is built, that both pages show it.
"""

import ast
import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from annotated_transformer import TransformerConfig

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "05_model.ipynb"
HTML = ROOT / "_build" / "html"
BASE_NUMBERS = "N = 6, d_model = 512, h = 8, d_ff = 2048, P_drop = 0.1"


def cells():
    return json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]


@pytest.fixture(scope="module")
def architecture_svg():
    "The chapter's drawing function, defined from the cell that holds it (its imports and definitions only)."
    (source,) = ["".join(c["source"]) for c in cells() if "def architecture_svg(" in "".join(c["source"])]
    tree = ast.parse(source)
    kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
    namespace = {"TransformerConfig": TransformerConfig}
    exec(compile(ast.Module(body=kept, type_ignores=[]), str(CHAPTER), "exec"), namespace)
    return namespace["architecture_svg"]


def texts(svg: str) -> list[str]:
    "The text elements of the drawing, as a reader sees them."
    root = ET.fromstring(svg)  # also proves it is well-formed XML
    return ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]


def test_the_drawing_shows_the_configuration_it_is_given(architecture_svg):
    labels = texts(architecture_svg(TransformerConfig.base()))
    assert BASE_NUMBERS in labels
    assert {"N = 6 ×", "× N = 6", "Feed-forward", "512 → 2048 → 512, ReLU"} <= set(labels)
    assert labels.count("h = 8 heads, d_k = 64") == 1  # the encoder's; the decoder's says it is masked
    assert labels.count("Add & LayerNorm") == 2 + 3  # post-norm: two sub-layers per encoder layer, three per decoder
    assert "LayerNorm" not in labels and "post-norm, as in the paper" in labels

    small = texts(architecture_svg(TransformerConfig(N=2, d_model=64, d_ff=128, h=4, norm_first=True)))
    assert "N = 2, d_model = 64, h = 4, d_ff = 128, P_drop = 0.1" in small
    assert {"N = 2 ×", "× N = 2", "64 → 128 → 64, ReLU", "pre-norm"} <= set(small)
    assert small.count("LayerNorm") == (2 + 1) + (3 + 1)  # before every sub-layer, and one closing each stack
    assert small.count("Add") == 2 + 3 and "Add & LayerNorm" not in small

    unshared = texts(architecture_svg(TransformerConfig.base(share_embeddings=False, positional="learned")))
    assert "its own weights" in unshared and "learned positional encoding" in unshared


def test_the_chapter_stores_the_base_model_under_the_glue_name(architecture_svg):
    glued = [
        o
        for c in cells()
        for o in c.get("outputs", [])
        if o.get("metadata", {}).get("scrapbook", {}).get("name") == "architecture"
    ]
    assert len(glued) == 1, "05_model.ipynb must store one output named 'architecture' (re-execute the notebook)"
    html = glued[0]["data"]["text/html"]
    assert ("".join(html) if isinstance(html, list) else html) == architecture_svg(TransformerConfig.base())


def test_the_landing_page_pastes_the_chapters_figure():
    index = (ROOT / "book" / "index.md").read_text(encoding="utf-8")
    assert re.search(r"^```\{glue\} architecture\n:doc: 05_model\.ipynb\n```$", index, flags=re.M)


@pytest.mark.parametrize("page", ["book/index.html", "book/05_model.html"])
def test_the_built_pages_show_the_figure(page):
    if not (HTML / page).is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("the book is not built (CI=true: the built book must be checked)")
        pytest.skip("the book is not built: run `make book-stored` or `make test` first")
    html = (HTML / page).read_text(encoding="utf-8")
    svgs = re.findall(r"<svg xmlns=\"http://www.w3.org/2000/svg\".*?</svg>", html, flags=re.S)
    assert len(svgs) == 1, f"{page}: expected the architecture figure once"
    assert BASE_NUMBERS in texts(svgs[0])
