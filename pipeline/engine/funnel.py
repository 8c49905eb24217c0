"""A run's funnel: the manifest's rows (inputs -> survivors after each stage -> kept) and the table printed
at the end of a run."""
from __future__ import annotations


def funnel_table(manifest: dict) -> str:
    rows = manifest.get("funnel", [])
    total = manifest.get("counts", {}).get("inputs", 0) or 0
    lines = [f"{'stage':<12}{'in':>10}{'out':>10}{'dropped':>10}{'kept %':>9}"]
    for r in rows:
        pct = 100.0 * r["out"] / total if total else 0.0
        lines.append(f"{r['stage']:<12}{r['in']:>10}{r['out']:>10}{r['in'] - r['out']:>10}{pct:>8.1f}%")
    kept = manifest.get("counts", {}).get("kept", 0)
    lines.append(f"{'kept':<12}{'':>10}{kept:>10}{'':>10}{(100.0 * kept / total if total else 0):>8.1f}%")
    standins = dedup_standins(manifest)
    if standins:
        found, n, kept = standins
        lines.append(f"dedup: {found} duplicates found, {n} of them scored in place of their cluster's rejected best "
                     f"member (dedup.max_fallbacks): later stages decided them, {kept} kept")
    for name, why in (manifest.get("skipped_stages") or {}).items():
        lines.append(f"skipped: {name}: {why}")
    for name, info in (manifest.get("stage_info") or {}).items():
        lines.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    return "\n".join(lines)


def dedup_standins(manifest: dict) -> tuple[int, int, int] | None:
    """(duplicates found, how many of them stood in for a rejected cluster member, how many of those were
    kept) when fallbacks made the funnel's dedup row drop fewer than were found; else None."""
    found = (manifest.get("dedup") or {}).get("duplicates")
    row = next((r for r in manifest.get("funnel", []) if r["stage"] == "dedup"), None)
    if not found or row is None:
        return None
    n = found - (row["in"] - row["out"])
    return (found, n, int((manifest.get("fallbacks") or {}).get("kept_fallbacks") or 0)) if n > 0 else None


def print_funnel(manifest: dict, con=None) -> None:
    """The funnel and the 15 commonest reject reasons: from the manifest's counts (`reject_reasons`,
    summed from the units' markers), else from the catalog's views through `con`."""
    print("\nfunnel")
    print(funnel_table(manifest))
    reasons = sorted((manifest.get("reject_reasons") or {}).items(), key=lambda kv: (-kv[1], kv[0]))[:15]
    if not reasons and con is not None and "reject_reasons" not in manifest:
        reasons = con.execute("SELECT reject_reason, count(*) FROM samples WHERE reject_reason IS NOT NULL "
                              "GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 15").fetchall()
    if reasons:
        print("\nreject reasons")
        for reason, n in reasons:
            print(f"  {n:>8}  {reason}")


def funnel_from_counts(rejected: dict[str, int], n_inputs: int, stage_names: list[str]) -> list[dict]:
    """inputs -> survivors after each stage -> kept (decide.funnel's shape, from grouped counts)."""
    from pipeline.decide import funnel_stages
    stage_names = funnel_stages(stage_names, rejected)  # 'input' first when a source had no bytes
    rows, alive = [], n_inputs
    for name in stage_names:
        out = alive - rejected.get(name, 0)
        rows.append({"stage": name, "in": alive, "out": out})
        alive = out
    unknown = sum(n for s, n in rejected.items() if s not in stage_names)
    if unknown:
        rows.append({"stage": "other", "in": alive, "out": alive - unknown})
    return rows
