"""Command palette (ctrl+p): the app's own commands first (method:, check:, receipt:, copy:, filter:, compare:,
promote:/demote:), Textual's own (theme, screenshot, quit ...) after them.

One provider yields both, so the order is ours: Textual gathers providers
concurrently and sorts hits by score alone, which would mix the two. Every
prompt and help line is literal text (a receipt id, a device name, a method
key are data, never markup).
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

MAX_RECEIPT_CANDIDATES = 200  # fuzzy-scoring 10,000 receipts on every keystroke would stall the palette
SYSTEM_WEIGHT = 0.5  # Textual's own commands rank below an equally good match among the app's


class ContractsCommands(Provider):
    def _static(self) -> list[tuple[str, object, str]]:
        app = self.app
        model = app.model
        out = []
        if model is None:
            return out
        for m in model.methods:
            out.append((f"method: {m.key}", partial(app.select_method, m.key),
                        f"{m.review}, {m.promotion}, gate {m.gate.verdict}"))
        for m in model.methods:
            if m.spec is not None:
                out.append((f"check: {m.key}", partial(app.start_check, m.key),
                            "run contracts check here (choose device and seeds); x stops it"))
        if len(app.marked) == 2:
            out.append(("compare: the two marked receipts", app.compare_marked, "what changed between them"))
        for m in model.methods:
            if m.spec is not None:
                action = "demote" if m.promotion == "promoted" else "promote"
                out.append((f"{action}: {m.key}", partial(app.change_promotion, m.key, action),
                            "reads the gate from the files, asks why, runs contracts " + action))
        for m in model.methods:
            for dev in ("cuda", "cpu"):
                cmd = f"contracts check {m.key} --device {dev}{app.flags}"
                out.append((f"copy: {cmd}", partial(app.copy_text, cmd), "copy this command to the clipboard"))
        out.append(("filter: failures only", app.toggle_failures, "show only failed, errored, tampered or corrupt"))
        out.append(("toggle: method tree", app.toggle_tree, "hide or show the methods (t)"))
        return out

    def _receipts(self, needle: str) -> list[tuple[str, object, str]]:
        model = self.app.model
        if model is None or len(needle) < 2:
            return []
        out = []
        for m in model.methods:
            for r in m.receipts:
                if needle in (r.receipt_id or "") or needle in r.file.lower():
                    out.append((f"receipt: {r.short_id}", partial(self.app.open_receipt, r.file),
                                f"{m.key} {r.created_at or '?'} {r.device} {r.status} {r.coverage_label} "
                                f"{r.freshness}"))
                    if len(out) >= MAX_RECEIPT_CANDIDATES:
                        return out
        return out

    def _system(self) -> list[tuple[str, object, str, bool]]:
        return [(c.title, c.callback, c.help, c.discover) for c in self.app.get_system_commands(self.screen)]

    async def discover(self) -> Hits:
        for text, callback, help_text in self._static():
            yield DiscoveryHit(Content(text), callback, text=text, help=Content(help_text))
        for text, callback, help_text, shown in sorted(self._system(), key=lambda c: c[0]):
            if shown:
                yield DiscoveryHit(Content(text), callback, text=text, help=Content(help_text))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        needle = query.lower().removeprefix("receipt:").strip()
        for text, callback, help_text in self._static() + self._receipts(needle):
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, highlight(matcher, text), callback, text=text, help=Content(help_text))
        for text, callback, help_text, _shown in self._system():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score * SYSTEM_WEIGHT, highlight(matcher, text), callback, text=text,
                          help=Content(help_text))


def highlight(matcher, text: str) -> Content:
    """`text` with the matched characters styled, as literal text (Matcher.highlight would parse it as markup)."""
    content = Content(text)
    score, offsets = matcher.fuzzy_search.match(matcher.query, text)
    if score:
        for offset in offsets:
            if not text[offset].isspace():
                content = content.stylize(matcher.match_style, offset, offset + 1)
    return content
