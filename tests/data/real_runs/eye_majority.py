"""The majority of several independent eye readings (``eye-readers/*.toml``), as ``eye-labels.toml`` entries.

Each file of ``eye-readers/`` is one reader's labels of the same runs, read apart (the
file's stem names the reader). A kind is labelled when more than half the readers label
it (``tracker.analysis.real_corpus.majority``). Prints, per kind, how many runs each
count of readers labelled, then one ``[[run]]`` per run read by every reader, to append
to ``eye-labels.toml``.

Run: ``python tests/data/real_runs/eye_majority.py [GROUP]``: GROUP (``batch8``) takes the reader files
named ``GROUP-*.toml`` only; the readers of one batch read the same runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tracker.analysis.real_corpus import KINDS, load_eye_readers, majority  # noqa: E402


def main() -> None:
    every = load_eye_readers(HERE)
    group = sys.argv[1] if len(sys.argv) > 1 else None
    readers = {who: r for who, r in every.items() if group is None or who.split("-")[0] == group}
    if not readers:
        sys.exit(f"no reader files{f' of {group}' if group else ''} in {HERE / 'eye-readers'}")
    names = sorted(set.intersection(*(set(r) for r in readers.values())))
    n = len(readers)
    print(f"# {len(names)} runs read by all {n} readers ({', '.join(readers)}); per kind, runs labelled by "
          + " / ".join(f"{k} of {n}" for k in range(1, n + 1)))
    for kind in KINDS:
        counts = [sum(kind in r[name].labels for r in readers.values()) for name in names]
        split = [[nm for nm, c in zip(names, counts) if c == k] for k in range(1, n + 1)]
        print(f"#   {kind:16s} " + " / ".join(str(len(s)) for s in split)
              + (f"   split: {', '.join(nm for s in split[:-1] for nm in s)}" if any(split[:-1]) else ""))
    for name in names:
        m = majority({who: r[name] for who, r in readers.items()})
        print(f'\n[[run]]\nname = "{name}"\nread_by = "eye, majority of {n} readers ({", ".join(readers)})"')
        print(f'confidence = "{"clear" if m.clear else "borderline"}"')
        if not m.labels:
            print("labels = []")
            continue
        print("labels = [")
        for lab in m.labels.values():
            fields = [f"kind = {json.dumps(lab.kind)}", f"onset = {lab.onset}"]
            if lab.best is not None:
                fields.append(f"best = {lab.best}")
            if lab.key:
                fields.append(f"key = {json.dumps(lab.key)}")
            fields.append(f"reason = {json.dumps(lab.reason)}")
            print("  { " + ", ".join(fields) + " },")
        print("]")


if __name__ == "__main__":
    main()
