"""Fixtures the TUI tests share: the demo project's store and an app on it (no polling, so tests drive time)."""

from __future__ import annotations

import pytest

import engine.spec.registry as registry
from benchmarks.synthetic_store import build_fixture_store, demo_static_names
from tui.app import create_app


@pytest.fixture()
def demo_names(monkeypatch):
    """The demo spec names registered things the real methods/ does not have."""
    monkeypatch.setattr(registry, "_STATIC", demo_static_names())


@pytest.fixture()
def store(tmp_path, demo_names):
    out = build_fixture_store(tmp_path / "proj")
    out["root"] = tmp_path / "proj"
    return out


def make_app(store, **kw):
    kw.setdefault("poll_seconds", None)
    return create_app(store["specs"], store["receipts"], store["root"], **kw)
