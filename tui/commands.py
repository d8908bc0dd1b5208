"""Command palette (ctrl+p): method: NAME, receipt: ID, copy: contracts check ..., filter: failures only."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

MAX_RECEIPT_CANDIDATES = 200  # fuzzy-scoring 10,000 receipts on every keystroke would stall the palette


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
            for dev in ("cuda", "cpu"):
                cmd = f"contracts check {m.key} --device {dev}{app.flags}"
                out.append((f"copy: {cmd}", partial(app.copy_text, cmd), "copy this command to the clipboard"))
        out.append(("filter: failures only", app.toggle_failures, "show only failed, errored, tampered or corrupt"))
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
                                f"{m.key} {r.created_at or '?'} {r.device} {r.status} {r.freshness}"))
                    if len(out) >= MAX_RECEIPT_CANDIDATES:
                        return out
        return out

    async def discover(self) -> Hits:
        for text, callback, help_text in self._static():
            yield DiscoveryHit(text, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        needle = query.lower().removeprefix("receipt:").strip()
        for text, callback, help_text in self._static() + self._receipts(needle):
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), callback, help=help_text)
