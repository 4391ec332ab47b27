"""The `jitgrad` loggers and the `JITGRAD_LOG` switch.

jitgrad logs through the standard `logging` module: `jitgrad.compile` (INFO: each kernel compile
and its duration, progress of long ones), `jitgrad.cache` (DEBUG: disk loads; INFO: evictions;
WARNING: damaged entries) and `jitgrad.progress` (INFO: which traced function a slow first call
compiles, kernel k of n). Configure them like any library's loggers, or set
`JITGRAD_LOG=compile` (comma-separated topics, or `all`; `compile` brings `progress` along) to print those
topics to stderr.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

TOPICS = {"compile": logging.INFO, "cache": logging.DEBUG, "progress": logging.INFO}
_installed: set[str] = set()


def configure_from_env() -> list[str]:
    """Attach a stderr handler to each topic named in `JITGRAD_LOG`; returns the topics enabled."""
    wanted = [t.strip().lower() for t in os.environ.get("JITGRAD_LOG", "").split(",") if t.strip()]
    if "all" in wanted:
        wanted = list(TOPICS)
    unknown = [t for t in wanted if t not in TOPICS]
    if unknown:
        warnings.warn(f"JITGRAD_LOG: unknown topic(s) {', '.join(unknown)}; known: {', '.join(TOPICS)}, all",
                      stacklevel=2)
    enabled = [t for t in wanted if t in TOPICS]
    if "compile" in enabled and "progress" not in enabled:
        enabled.append("progress")  # the per-function summary of what compiles, among the compile lines
    for topic in enabled:
        if topic in _installed:
            continue
        logger = logging.getLogger(f"jitgrad.{topic}")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("jitgrad %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(TOPICS[topic])
        _installed.add(topic)
    return enabled


def printing(topic: str) -> bool:
    """Does `JITGRAD_LOG` print `topic` to stderr (a handler installed by `configure_from_env`)? Then progress
    goes there too rather than to a line of its own."""
    return topic in _installed
