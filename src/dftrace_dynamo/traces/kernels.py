"""The ``summary --by kernel`` view: per Inductor kernel (``cat:"kernel"`` events written
with ``level="inductor"``) its count, total, mean, p50, p99, share of all kernel time and
the ATen ops it fused (``aten_ops``, joined over its call sites), in one DuckDB query over
the sources :func:`.summary.summarize` reads."""

CAT_KERNEL = "kernel"
COLUMNS = ("{'ph':'VARCHAR','cat':'VARCHAR','name':'VARCHAR','dur':'DOUBLE',"
           "'args':'STRUCT(aten_ops VARCHAR[], kernel_type VARCHAR)'}")


def view(con, source_sql, params, top):
    """Rows of the kernel view, largest total first, at most ``top``."""
    rows = con.execute(f"""
WITH k AS (
    SELECT e.name, e.dur, e.args.kernel_type AS kind, e.args.aten_ops AS ops
    FROM ({source_sql}) e WHERE e.ph = 'X' AND e.cat = '{CAT_KERNEL}'
)
SELECT name, any_value(kind), count(*), sum(dur), avg(dur), quantile_cont(dur, [0.5, 0.99]),
       list_sort(list_distinct(flatten(list(coalesce(ops, []))))), sum(sum(dur)) OVER ()
FROM k GROUP BY name ORDER BY sum(dur) DESC, name LIMIT ?
""", [*params, top]).fetchall()
    return [{"key": name, "kernel_type": kind, "count": count, "total_us": total, "mean_us": mean,
             "p50_us": quant[0], "p99_us": quant[1], "share": total / grand if grand else 0.0,
             "fused_ops": ", ".join(ops)}
            for name, kind, count, total, mean, quant, ops, grand in rows]
