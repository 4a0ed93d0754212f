"""The LoCoMo data set as benches/locomo.py reads it: conversations of dated sessions, each turn
one memory, and the questions of categories 1-4 with evidence in their conversation
(/work/shared/data/README.md describes the file)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["DEFAULT_DATA", "Conversation", "Turn", "load"]

REPO = Path(__file__).resolve().parents[1]
# shared/ sits beside the checkout (CI, /work/main) or beside the worktrees' folder (/work/wt/NAME).
DEFAULT_DATA = next(
    (
        p
        for p in (
            REPO.parent / "shared" / "data" / "locomo-dev.json",
            REPO.parents[1] / "shared" / "data" / "locomo-dev.json",
        )
        if p.is_file()
    ),
    REPO.parent / "shared" / "data" / "locomo-dev.json",
)


@dataclasses.dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    memory_text: str
    session: int
    created_at: float


@dataclasses.dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[tuple[str, list[str]]]


def _session_time(raw: str) -> float:
    # "1:56 pm on 8 May, 2023"
    return datetime.strptime(raw, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def load(path: Path) -> list[Conversation]:
    out = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        turns, n = [], 1
        while f"session_{n}" in conv:
            start = _session_time(conv[f"session_{n}_date_time"])
            for i, t in enumerate(conv[f"session_{n}"]):
                text = f"{t['speaker']}: {t['text']}"
                if t.get("blip_caption"):
                    text += f" [shares a photo: {t['blip_caption']}]"
                turns.append(Turn(t["dia_id"], t["speaker"], t["text"], text, n, start + i))
            n += 1
        ids = {t.dia_id for t in turns}
        questions = []
        for qa in sample["qa"]:
            evidence = [e for e in qa.get("evidence", []) if e in ids]
            if qa["category"] in (1, 2, 3, 4) and evidence:
                questions.append((qa["question"], evidence))
        out.append(Conversation(sample["sample_id"], turns, questions))
    return out
