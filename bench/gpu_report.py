"""bench/gpu_engine.py's tables: ceilings, kernel checks, figures against ceilings, the linear layers
per batch size (FP8 / NVFP4 against bf16), and the issue's targets."""


def render(ceilings: dict, checks: list, rows: list, linears: list, targets: list) -> str:
    lines = [
        "ceilings: " + ", ".join(f"{k}={v:.3g}" if v else f"{k}=n/a" for k, v in ceilings.items()),
        "",
        "| kernel check | rel error | bound | ok |",
        "|---|---:|---:|---|",
    ]
    lines += [
        f"| {c['name']} | {c['rel_error']:.2e} | {c['bound']:.0e} | {'yes' if c['ok'] else 'NO'} |" for c in checks
    ]
    lines += ["", "| section | config | value | unit | ceiling | fraction |", "|---|---|---:|---|---:|---:|"]
    lines += [
        f"| {r['section']} | {r['config']} | {r['value']:.4g} | {r['unit']} | {r['ceiling']:.4g} | "
        f"{r['fraction']:.3f} |"
        for r in rows
    ]
    if linears:
        lines += ["", *linear_table(linears)]
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    lines += [f"| {t['target']} | {_num(t['measured'])} | {t['goal']:.4g} | {_met(t['met'])} |" for t in targets]
    return "\n".join(lines)


def linear_table(linears: list) -> list[str]:
    """Per layer and m: microseconds, the paths picked, and whether each format beats bf16; then per m
    over all layers (each once): the check that NVFP4 and FP8 are never slower than bf16."""
    out = [
        "| layer | m | bf16 us | fp8 us (path) | nvfp4 us (path) | fp8 / bf16 speed | nvfp4 / bf16 speed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in linears:
        bf16 = r["bf16_seconds"]
        out.append(
            f"| {r['layer']} | {r['m']} | {bf16 * 1e6:.1f} | {r['fp8_seconds'] * 1e6:.1f} ({r['fp8_path'] or 'untimed'}) "
            f"| {r['nvfp4_seconds'] * 1e6:.1f} ({r['nvfp4_path'] or 'untimed'}) | {bf16 / r['fp8_seconds']:.2f} | "
            f"{bf16 / r['nvfp4_seconds']:.2f} |"
        )
    out += [
        "",
        "| m | fp8 / bf16 speed, all layers | nvfp4 / bf16 speed, all layers | nvfp4 never slower |",
        "|---:|---:|---:|---|",
    ]
    for m in sorted({r["m"] for r in linears}):
        at = [r for r in linears if r["m"] == m]
        total = {p: sum(r[f"{p}_seconds"] for r in at) for p in ("bf16", "fp8", "nvfp4")}
        out.append(
            f"| {m} | {total['bf16'] / total['fp8']:.2f} | {total['bf16'] / total['nvfp4']:.2f} | "
            f"{_met(total['nvfp4'] <= total['bf16'])} |"
        )
    return out


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _met(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "**no**")
