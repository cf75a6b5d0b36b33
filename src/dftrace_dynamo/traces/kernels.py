"""The ``summary --by kernel`` view: per Inductor kernel (``cat:"kernel"`` events written
with ``level="inductor"``) its count, total, mean, p50, p99, share of all kernel time and
the ATen ops it fused (``aten_ops``, joined over its call sites). Kernel events are op
events for the other views (module, phase, graph, process); this view reads the
``extra`` column (JSON text) that :mod:`.summary` keeps for them in its event table."""

# what summary's event table keeps of a kernel event, as JSON text in its ``extra`` column
INFO = "struct_pack(kernel_type := e.args.kernel_type, aten_ops := coalesce(e.args.aten_ops, []))"


def view(con, where, top):
    """Rows of the kernel view, largest total first, at most ``top``; ``where`` keeps
    the op rows (kernel events are op events with ``extra`` set) and leaves out the
    warm-up steps as the other views do."""
    rows = con.execute(f"""
SELECT name, any_value(json_extract_string(extra, '$.kernel_type')), count(*), sum(dur), avg(dur),
       quantile_cont(dur, [0.5, 0.99]),
       list_sort(list_distinct(flatten(list(CAST(json_extract(extra, '$.aten_ops') AS VARCHAR[]))))),
       sum(sum(dur)) OVER ()
FROM ev e WHERE extra IS NOT NULL AND {where}
GROUP BY name ORDER BY sum(dur) DESC, name LIMIT ?
""", [top]).fetchall()
    return [{"key": name, "kernel_type": kind, "count": count, "total_us": total, "mean_us": mean,
             "p50_us": quant[0], "p99_us": quant[1], "share": total / grand if grand else 0.0,
             "fused_ops": ", ".join(ops)}
            for name, kind, count, total, mean, quant, ops, grand in rows]
