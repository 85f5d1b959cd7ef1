"""The Jupyter Book configuration of one build of the book, written from _config.yml for the Makefile.

    python book/_ext/edition_config.py [--language zh_CN] [--execute off] [--gettext] > _build/config-X.yml

`--language zh_CN` is the Chinese edition: Sphinx reads its prose from locales/zh_CN/LC_MESSAGES/ (the catalogues),
the theme's own words are Chinese, and search splits Chinese text into words with jieba. It shares the English
edition's execution cache (_build/.jupyter_cache), so a notebook the English build executed is not executed again.
`--execute off` renders the outputs stored in the notebooks (`make book-stored`). `--gettext` is the configuration
that extracts the English text into message templates (`make catalogues`): it never executes, since program output
is not translated. The local Sphinx extensions are named by absolute path, since Jupyter Book resolves them against
the configuration file, which lives in _build/ (Sphinx resolves the other paths against the book's folder).
"""

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TITLES = {"zh_CN": "The Annotated Transformer 中文版"}
# Jupyter Book sets the search box's text itself, in English; the theme translates its other words.
SEARCH_BAR_TEXTS = {"zh_CN": "搜索本书……"}
CODE_PROMPTS = {"zh_CN": ("显示代码单元格", "隐藏代码单元格")}


def edition_config(language: str = "en", execute: str | None = None, gettext: bool = False) -> dict:
    "_config.yml, adapted to one edition and one way of executing the notebooks."
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    sphinx = config["sphinx"]
    sphinx["local_extensions"] = {k: str(ROOT / v) for k, v in (sphinx.get("local_extensions") or {}).items()}
    if execute is not None:
        config["execute"]["execute_notebooks"] = execute
    if gettext:
        config["execute"]["execute_notebooks"] = "off"
    if language != "en":
        config["title"] = TITLES[language]
        config["execute"]["cache"] = str(ROOT / "_build" / ".jupyter_cache")
        sphinx["config"]["language"] = language
        sphinx["config"]["html_search_language"] = language.split("_")[0]
        sphinx["config"]["html_theme_options"] = {"search_bar_text": SEARCH_BAR_TEXTS[language]}
        # MyST-NB's buttons on hidden cells ("Show code cell source", ...).
        sphinx["config"]["nb_code_prompt_show"], sphinx["config"]["nb_code_prompt_hide"] = CODE_PROMPTS[language]
        sphinx["recursive_update"] = True  # so that the theme options above join Jupyter Book's, not replace them
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--language", default="en", choices=["en", *TITLES])
    parser.add_argument("--execute", choices=["cache", "off"], help="default: _config.yml's setting")
    parser.add_argument("--gettext", action="store_true", help="the configuration that extracts the messages")
    args = parser.parse_args(argv)
    yaml.safe_dump(edition_config(args.language, args.execute, args.gettext), sys.stdout, allow_unicode=True)


if __name__ == "__main__":
    main()
