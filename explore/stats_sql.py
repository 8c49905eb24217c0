"""The SQL building blocks of explore/stats.py: manifest and threshold lookups, row fetching, reason
kinds and quantiles (exact below EXACT_MAX_ROWS samples, else from a reservoir sample)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from catalog.rules import Rule


QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)


EXACT_MAX_ROWS = 20_000_000  # above this many samples quantiles come from a reservoir sample


RESERVOIR = 1_000_000


REASON_KIND = "trim(regexp_extract({col}, '^([^:]*(:[^:]*)?)', 1))"


_REASON_KIND_RE = re.compile(r"^([^:]*(:[^:]*)?)")


def reason_kind(reason: str) -> str:
    """REASON_KIND in Python."""
    return _REASON_KIND_RE.match(reason).group(1).strip()


FAILED = "NOT coalesce(keep, false)"


def read_manifest(run_dir) -> dict:
    """RUN/manifest.json, or {} for a run that has not written one (yet)."""
    from catalog.storage import is_uri, storage_for
    if is_uri(run_dir):  # a run on an object store
        store = storage_for(run_dir)
        return store.read_json("manifest.json") if store.exists("manifest.json") else {}
    path = Path(run_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def threshold(manifest: dict, rule: Rule | None):
    """The active threshold of `rule` in the run's manifest: its config value, the rule's default
    when the config lacks the key, None without a config (a run with no manifest) or when off."""
    config = manifest.get("config")
    if rule is None or not config:
        return None
    section = config.get(rule.stage)
    return rule.threshold(section if isinstance(section, dict) else {})


def fetch_rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def percent(n, total) -> float:
    return round(100.0 * n / total, 2) if total else 0.0


def quantile_sql(expr: str, where: str = "", exact: bool = True) -> str:
    """quantiles, n, mean, min, max of expr. Exact quantiles hold every value in memory, so large
    catalogs use a reservoir sample (RESERVOIR values); min and max stay exact either way."""
    qs = ", ".join(str(q) for q in QUANTILES)
    f = f" FILTER (WHERE {where})" if where else ""
    q = f"quantile_cont({expr}, [{qs}])" if exact else f"reservoir_quantile({expr}, [{qs}], {RESERVOIR})"
    return f"{q}{f}, count({expr}){f}, avg({expr}){f}, min({expr}){f}, max({expr}){f}"


N_QUANTILE_SQL = 5  # values _quantile_sql yields


def quantile_dict(qs, n, mean, lo, hi, exact: bool = True) -> dict:
    if not n:
        return {"n": 0}
    q = {f"p{round(q * 100):g}": round(float(v), 4) for q, v in zip(QUANTILES, qs)}
    q["p0"], q["p100"] = round(float(lo), 4), round(float(hi), 4)
    return {"n": n, "mean": round(float(mean), 4), "quantiles": q, **({} if exact else {"approximate": True})}


def quantile_block(con, cols: list[str], scopes: dict[str, str], source: str, exact: bool) -> dict:
    """{scope: {col: quantile dict}} in one scan; scopes map a name to a filter ('' = all rows)."""
    parts = [quantile_sql(c, where, exact) for where in scopes.values() for c in cols]
    vals = con.execute(f"SELECT {', '.join(parts)} FROM {source}").fetchone()
    out, k = {}, 0
    for scope in scopes:
        out[scope] = {}
        for c in cols:
            out[scope][c] = quantile_dict(*vals[k:k + N_QUANTILE_SQL], exact=exact)
            k += N_QUANTILE_SQL
    return out

