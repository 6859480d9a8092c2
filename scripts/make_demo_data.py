"""Regenerate the demo's small chat dataset (fsdp_tune/assets/demo_chat/{train,test}.jsonl).

Synthetic and deterministic: short, regular conversations that a tiny randomly initialised model can
visibly learn in a minute on two CPU cores. No download, no licence question.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "fsdp_tune" / "assets" / "demo_chat"
CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Canada": "Ottawa",
    "Norway": "Oslo",
    "Chile": "Santiago",
    "India": "New Delhi",
    "Ghana": "Accra",
    "Greece": "Athens",
    "Poland": "Warsaw",
    "Cuba": "Havana",
}
COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]
THINGS = ["apple", "river", "engine", "garden", "window", "rocket", "pencil", "castle", "violin", "forest"]


def conversation(rng: random.Random) -> list[dict[str, str]]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        q, ans = f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    elif kind == 1:
        country = rng.choice(sorted(CAPITALS))
        q, ans = f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."
    elif kind == 2:
        word = rng.choice(THINGS)
        q, ans = f"Spell the word {word} backwards.", f"{word} backwards is {word[::-1]}."
    elif kind == 3:
        colour, thing = rng.choice(COLOURS), rng.choice(THINGS)
        q, ans = f"Describe a {colour} {thing} in one sentence.", f"It is a {thing}, and it is {colour}."
    else:
        n = rng.randint(2, 9)
        q, ans = f"Count from 1 to {n}.", " ".join(str(i) for i in range(1, n + 1)) + "."
    return [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": q},
        {"role": "assistant", "content": ans},
    ]


def main() -> None:
    rng = random.Random(20261129)
    OUT.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 640), ("test", 64)):
        with open(OUT / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps({"messages": conversation(rng)}) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
