"""The book's pictures: interactive Vega-Lite charts that render offline in the built book (the pinned JavaScript,
vendored and checksummed) and in Jupyter, with a static PNG beside each for viewers that run no JavaScript; the SVG
figures drawn from code; Markdown tables of results; and a run's curves.

Book tooling, not part of the installed package: the chapters import it as `_ext.book_charts` (their working folder is
book/), and the Makefile runs `python book/_ext/book_charts.py vendor DEST` before building the book."""

import base64
import hashlib
import html as _html
import io
import json
import re as _re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from annotated_transformer.lib.runs import RunDir


JS_ASSETS = {
    # npm name: (version, sha512 integrity of the registry tarball, files to keep from its `package/` folder)
    "vega": (
        "6.3.0",
        "sha512-L/ykPslBI5QiElzs7jD01c/0EP2yzJ0SdQ3WLZkgBsmykNkhfilWLAa24RzDx67rilNLdeBCJVCmogi40xJ6yA==",
        ("LICENSE", "build/vega.min.js"),
    ),
    "vega-lite": (
        "6.4.1",
        "sha512-KO3ybHNouRK4A0al/+2fN9UqgTEfxrd/ntGLY933Hg5UOYotDVQdshR3zn7OfXwQ7uj0W96Vfa5R+QxO8am3IQ==",
        ("LICENSE", "build/vega-lite.min.js"),
    ),
    "vega-embed": (
        "7.3.0",
        "sha512-wQ8s5GaSzqoKgmRfbRolgBrjE2CP7ZKHXqH7NijxMqPjpdWxSs4Dn8tvp9g0giQvh2cK+3p56sxjWWM0wNngGw==",
        ("LICENSE", "build/vega-embed.min.js"),
    ),
    # MathJax's combined TeX-to-HTML component, the fonts it loads and the extensions it may load on demand.
    "mathjax": (
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        ("LICENSE", "es5/tex-chtml.js", "es5/output/chtml/fonts/woff-v2/", "es5/input/tex/extensions/", "es5/ui/"),
    ),
}
"The JavaScript the rendered book needs, pinned: the chart libraries Altair's Vega-Lite 6 specs need, and MathJax 3."


CHART_SCRIPTS = ("vega/build/vega.min.js", "vega-lite/build/vega-lite.min.js", "vega-embed/build/vega-embed.min.js")
"The chart libraries in the order a page must load them (each one needs the ones before it)."


NPM_REGISTRY = "https://registry.npmjs.org"


CDN = "https://cdn.jsdelivr.net/npm"


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _keep(member: str, wanted) -> bool:
    return any(member == w or (w.endswith("/") and member.startswith(w)) for w in wanted)


def vendor_javascript(dest, registry: str = NPM_REGISTRY, *, quiet: bool = False) -> Path:
    """Fetch the pinned JavaScript in `JS_ASSETS` from the npm registry into `dest` (one folder per package).

    Each tarball is checked against its pinned sha512 before anything is unpacked; a package whose folder
    already holds the pinned version is skipped. A package is unpacked into a temporary folder and renamed
    into place, so an interrupted run never leaves a half-written library behind.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, (version, integrity, wanted) in JS_ASSETS.items():
        target = dest / name
        stamp = target / ".version"
        if stamp.is_file() and stamp.read_text() == version:
            continue
        url = f"{registry}/{name}/-/{name}-{version}.tgz"
        if not quiet:
            print(f"fetching {name}@{version} from {registry}")
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
        except OSError as err:
            raise RuntimeError(
                f"could not download {url} ({err}); the book needs it to render offline. "
                "Check the network, or point `registry` at a reachable npm registry."
            ) from err
        if _integrity(data) != integrity:
            raise RuntimeError(f"{url} does not match its pinned checksum {integrity}; refusing to use it.")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest))
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                for member in tar.getmembers():
                    relative = member.name.removeprefix("package/")
                    if member.isfile() and _keep(relative, wanted):
                        member.name = relative
                        tar.extract(member, tmp, filter="data")
            (tmp / ".version").write_text(version)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


_CHART_TEMPLATE = """<div class="at-chart" id="{div_id}"></div>
<script type="text/javascript">
(function (spec, embedOptions) {{
  // The element just before this script, or (where scripts run detached, as in classic Jupyter) by its id.
  const prev = document.currentScript && document.currentScript.previousElementSibling;
  const el = prev && prev.id === "{div_id}" ? prev : document.getElementById("{div_id}");
  const show = () => vegaEmbed(el, spec, embedOptions).catch(err => {{ el.textContent = "Chart error: " + err; }});
  if (typeof vegaEmbed === "function") {{ show(); return; }}
  // Not in the book, whose pages load the vendored libraries: fetch the same pinned versions.
  const urls = {urls};
  if (typeof define === "function" && define.amd) {{
    require.config({{paths: Object.fromEntries(Object.entries(urls).map(([k, u]) => [k, u.replace(/\\.js$/, "")]))}});
    require(["vega-embed"], ve => {{ window.vegaEmbed = ve; show(); }});
    return;
  }}
  const load = url => new Promise((resolve, reject) => {{
    const s = document.createElement("script");
    s.src = url; s.onload = resolve; s.onerror = () => reject(new Error("could not load " + url));
    document.head.appendChild(s);
  }});
  Object.values(urls).reduce((p, url) => p.then(() => load(url)), Promise.resolve())
    .then(show, err => {{ el.textContent = "Chart error: " + err.message; }});
}})({spec}, {options});
</script>"""


def chart_html(spec: dict, embed_options=None) -> str:
    """HTML that draws the Vega-Lite `spec` with vega-embed.

    On a page of the rendered book the vendored libraries are already loaded and are used as they are;
    anywhere else (Jupyter, Colab) the pinned versions of `JS_ASSETS` are fetched from a CDN. The element
    id is derived from the spec, so the same chart gives the same HTML on every run.
    """
    options = {"actions": False, "renderer": "svg", **(embed_options or {})}
    # "</" inside a string of the spec would end the <script> element early; "<\/" means the same in JSON.
    text = json.dumps(spec, sort_keys=True).replace("</", "<\\/")
    urls = {
        name: f"{CDN}/{name}@{JS_ASSETS[name][0]}/{path.split('/', 1)[1]}"
        for name, path in zip(("vega", "vega-lite", "vega-embed"), CHART_SCRIPTS)
    }
    return _CHART_TEMPLATE.format(
        div_id="at-chart-" + hashlib.sha1(text.encode()).hexdigest()[:12],
        urls=json.dumps(urls),
        spec=text,
        options=json.dumps(options, sort_keys=True),
    )


def chart_png(spec: dict) -> bytes:
    """A PNG picture of the Vega-Lite `spec`, drawn in Python by vl-convert (Vega's own renderer, bundled): what a
    viewer that runs no JavaScript shows (GitHub, nbviewer, an untrusted notebook)."""
    import vl_convert

    return vl_convert.vegalite_to_png(spec, scale=1)


def book_renderer(spec: dict, **metadata) -> dict:
    """An Altair renderer whose output works in the offline book and in Jupyter alike (see `chart_html`), with a
    static picture beside it (`chart_png`) for viewers that run no JavaScript."""
    bundle = {"text/html": chart_html(spec, metadata.get("embed_options")), "text/plain": "<Vega-Lite chart>"}
    try:
        bundle["image/png"] = base64.b64encode(chart_png(spec)).decode()
    except ModuleNotFoundError:  # vl-convert comes with the book's extra; without it, the interactive chart alone
        pass
    return bundle


def use_book_charts() -> None:
    "Make Altair draw every chart with `book_renderer`."
    import altair as alt

    alt.renderers.register("annotated_transformer", book_renderer)
    alt.renderers.enable("annotated_transformer")


_FONT = 'font-family="Helvetica, Arial, sans-serif"'


def svg_text(x, y, text, size=13, anchor="middle", bold=False, color="#222"):
    "One line of SVG text centred vertically on y; `d_k`, `d_{model}`, `W^O` get sub- and superscripts as in the paper."
    pieces, shift = [], 0
    for i, piece in enumerate(_re.split(r"([_^](?:\{[^}]*\}|\w))", text)):
        if not piece:
            continue
        target = (4 if piece[0] == "_" else -6) if i % 2 else 0  # odd pieces are the scripts
        content = _html.escape(piece[1:].strip("{}") if i % 2 else piece)
        small = f' font-size="{size * 0.72:.1f}"' if i % 2 else ""
        move = f' dy="{target - shift}"' if target != shift else ""
        pieces.append(f"<tspan{move}{small}>{content}</tspan>")
        shift = target
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x}" y="{y + 0.35 * size:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}"{weight} '
        f"{_FONT}>{''.join(pieces)}</text>"
    )


def svg_box(cx, cy, w, h, title, note="", fill="#eee", dashed=False, copies=1):
    "A rounded box centred on (cx, cy), with a bold title and a note; `copies` > 1 stacks shadows behind it."
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    parts = [
        f'<rect x="{cx - w / 2 + 6 * k}" y="{cy - h / 2 - 6 * k}" width="{w}" height="{h}" rx="6" '
        f'fill="{fill}" stroke="#333"{dash}/>'
        for k in reversed(range(min(copies, 3)))
    ]
    if note:
        return parts + [svg_text(cx, cy - 8, title, bold=True), svg_text(cx, cy + 10, note, size=11)]
    return parts + [svg_text(cx, cy, title, bold=True)]


def svg_arrow(points, label="", dx=8, anchor="start"):
    "A line through `points` ending in an arrowhead, labelled beside the middle of its first segment."
    path = " ".join(f"{x},{y}" for x, y in points)
    parts = [f'<polyline points="{path}" fill="none" stroke="#333" stroke-width="1.4" marker-end="url(#arrowhead)"/>']
    if label:
        (x0, y0), (x1, y1) = points[0], points[1]
        parts.append(svg_text((x0 + x1) / 2 + dx, (y0 + y1) / 2, label, size=11, anchor=anchor, color="#555"))
    return parts


def svg_figure(width, height, parts, title):
    "The SVG document: its title (for screen readers), a white page, the arrowhead marker, and the parts."
    marker = (
        '<defs><marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>'
    )
    body = "\n".join(
        [
            f"<title>{_html.escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="white"/>',
            marker,
            *parts,
        ]
    )
    from IPython.display import SVG  # notebooks display it; the package does not need IPython otherwise

    return SVG(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">{body}</svg>'
    )


def markdown_table(rows: list[dict]):
    """Rows of equal keys as a Markdown table (an `IPython.display.Markdown`), shown as a table by Jupyter and by the
    book; floats with 2 decimals."""
    from IPython.display import Markdown

    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += [
        "| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()) + " |" for row in rows
    ]
    return Markdown("\n".join(lines))


def plot_metrics(run_dir, ax=None):
    """Plot a run's training and validation loss against the update step, from its metrics.jsonl (Matplotlib,
    which this function imports on demand). Returns the Axes."""
    try:
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as err:  # Matplotlib comes with the book's extra, not with the package
        raise ModuleNotFoundError(
            f"plot_metrics draws with Matplotlib ({err}): pip install "
            "'annotated-transformer[book]', or pip install matplotlib",
            name=err.name,
        ) from None

    rows = RunDir(run_dir, writer=False).logged_metrics()
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["train_loss"] for r in rows], "o-", label="training: label-smoothed loss per token")
    ax.plot(steps, [r["valid_loss"] for r in rows], "s-", label="validation: cross-entropy per token")
    ax.set(xlabel="update", ylabel="loss (nats per token)", title=Path(run_dir).name)
    ax.legend()
    return ax


if __name__ == "__main__":  # python book/_ext/book_charts.py vendor DEST [REGISTRY]
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "vendor":
        sys.exit("usage: python book/_ext/book_charts.py vendor DEST [REGISTRY]")
    vendor_javascript(sys.argv[2], *sys.argv[3:])
