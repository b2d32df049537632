"""One-off (issue 23 item 4): the GEMV's one hint became one hint per kernel. Proves that the kernel
choices and tuner lists of this code are the committed table's under the explicit old->new hint
mapping, then regenerates the table through that mapping.

1. legacy view: the table of this code with every GEMV hint mapped back to the one-hint fields
   (bitblas.schedule.gemv.hints.to_legacy, class "GEMVHint"), digests included, must equal the
   committed table case for case;
2. migrated: the committed table with every hint dict mapped old -> new (hint_from_dict of the old
   dict, which maps "GEMVHint" through from_legacy), and the tuner digests (sha over the ordered
   list, count per class) of this code -- whose legacy view step 1 proved equal -- must equal the
   table of this code case for case;
3. --write: write the migrated table.
Run from the repository root: python testing/migrate_choice_table_gemv_hints.py [--write]
"""
import collections, copy, hashlib, json, sys
import os
sys.path[:0] = [os.getcwd(), "testing"]
import choice_table as ct
from bitblas.schedule import hint_from_dict, hint_to_dict
from bitblas.schedule.gemv.hints import GEMV_HINTS, to_legacy


def legacy(hint):
    if isinstance(hint, GEMV_HINTS):
        return "GEMVHint", to_legacy(hint)
    return type(hint).__name__, dict(vars(hint))


def legacy_view():
    saved = ct._Hints.__call__, ct._hint_key, ct._digest

    def call(self, hint):
        if hint is None:
            return None
        name, fields = legacy(hint)
        d = {"class": name, **fields}
        if name != "GEMVHint":
            d = hint_to_dict(hint)
        key = json.dumps(d, sort_keys=True)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.dicts)
            self.dicts.append(d)
        return i

    def hint_key(hint):
        name, fields = legacy(hint)
        return f"{name}{sorted(fields.items())}"

    def digest(cands):
        text = "\n".join(f"{c.plan_m} {hint_key(c.hint)}" for c in cands)
        classes = collections.Counter(legacy(c.hint)[0] for c in cands)
        return {"n": len(cands), "sha": hashlib.sha256(text.encode()).hexdigest()[:16],
                "classes": dict(sorted(classes.items()))}

    ct._Hints.__call__, ct._hint_key, ct._digest = call, hint_key, digest
    try:
        return ct.compute()
    finally:
        ct._Hints.__call__, ct._hint_key, ct._digest = saved


def main():
    old = ct.load()
    counts = ct.count_cases(old)
    print("committed table:", sum(counts.values()), "cases", counts, len(old["hints"]), "distinct hints")
    view = legacy_view()
    n, lines = ct.diff(old, view)
    print("\n".join(lines))
    print(f"1. legacy view of this code vs the committed table: {n} of {sum(counts.values())} cases differ")
    new = ct.compute()
    mapped = [hint_to_dict(hint_from_dict(d)) for d in old["hints"]]
    changed = sum(a != b for a, b in zip(old["hints"], mapped))
    classes = collections.Counter(f"{a['class']} -> {b['class']}" for a, b in zip(old["hints"], mapped)
                                  if a["class"] != b["class"])
    print(f"   hint dicts mapped old -> new: {changed} of {len(mapped)} changed: {dict(classes)}")
    mig = copy.deepcopy(old)
    mig["hints"] = mapped
    digests = 0
    for case, v in mig["tune"].items():
        for k in ("sha", "classes"):
            if v.get(k) != new["tune"][case].get(k):
                digests += k == "sha"
                v[k] = new["tune"][case][k]
    print(f"   tuner digests taken from this code (their legacy view equal, step 1): {digests} shas")
    n2, lines2 = ct.diff(mig, new)
    print("\n".join(lines2))
    print(f"2. migrated table vs the table of this code: {n2} cases differ")
    # the inverse on every GEMV hint of the new table
    bad = [d for d in new["hints"] if d["class"].startswith("GEMV") and
           hint_to_dict(hint_from_dict({"class": "GEMVHint", **to_legacy(hint_from_dict(d))})) != d]
    print(f"   GEMV hints of this code that do not round-trip new -> old -> new: {len(bad)} of "
          f"{sum(d['class'].startswith('GEMV') for d in new['hints'])}")
    if n or n2 or bad:
        return 1
    if "--write" in sys.argv:
        size = ct.write(mig)
        print(f"3. wrote {ct.TABLE_PATH} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
