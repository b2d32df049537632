"""The k-split kernel of the GEMV template (bitblas/schedule/gemv/, ``GEMVKSplitHint``): the
warps of a block split K, each lane keeps its slice of the activations in registers, blocks
walk row batches (grid-stride) and meet in shared memory. The decode, scale and store lines come from template.py's ``kernel_script`` (its locals, ``e``); why the kernel looks as
it does: emit.py's and template.py's docstrings.

measurements: docs/performance.md
"""
from __future__ import annotations

from .emit import device_entry


def body(plan, hint, add, e):
    """``k_warps`` warps split K; each lane keeps its slice of the activations in registers for
    the whole kernel; blocks walk batches of ``rows_per_warp`` rows (grid-stride), the packed
    weights and raw scales / zeros of batch b+1 in flight while batch b is decoded (two register
    slots), and meet in shared memory once per batch."""
    m, N, NC, NA, NW = e["m"], e["N"], e["NC"], e["NA"], e["NW"]
    WK, R = hint.k_warps, hint.rows_per_warp
    NJ = -(-NC // (32 * WK))                 # vectors per lane
    NB = -(-N // R)                          # row batches
    GRID = min(NB, hint.grid or NB)
    guard = NJ * 32 * WK != NC
    sdt, zdt = e["sdt"], e["zdt"]
    # persistent: its stores are inside the batch loop, so the next kernel may launch at entry
    device_entry(add, hint, GRID, 32 * WK, (2, R, NJ), NW, sdt, zdt, trigger=True)
    add(f"    ar = T.alloc_local(({NA},), 'uint32')")
    add(f"    ap = T.alloc_local(({m}, {NJ}, {e['ap_len']}), {e['ap_dtype']!r})")
    add(f"    asum = T.alloc_local(({m}, {NJ}), 'float32')")
    add(f"    dq = T.alloc_local(({e['ap_len']},), {e['ap_dtype']!r})")
    add(f"    acc = T.alloc_local(({R}, {m}), 'float32')")
    add(f"    sv = T.alloc_local(({R}, {NJ}), 'float32')")
    add(f"    cv = T.alloc_local(({R}, {NJ}), 'float32')")
    add(f"    ov = T.alloc_local(({R}, {NJ}), 'int32')")
    add(f"    red = T.alloc_buffer((2, {WK}, {R * m}), 'float32', scope='shared')")
    add("    lane = T.meta_var(tx % 32)")
    add("    kw = T.meta_var(tx // 32)")
    add(f"    nbk = T.meta_var((({NB} - bx) + {GRID - 1}) // {GRID})")
    cexpr = f"((kw * {NJ} + j) * 32 + lane)"
    cload = f"T.min({cexpr}, {NC - 1})" if guard else cexpr
    nr = f"T.min((bx + (BATCH) * {GRID}) * {R} + r, {N - 1})"

    def load(ind, batch, slot):
        row = nr.replace("BATCH", batch)
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        for ln in e["load_lines"](ind + "        ", row, cload, f"{slot}, r, j"):
            add(ln)

    def process(ind, batch, slot):
        n0 = f"(bx + ({batch}) * {GRID}) * {R}"
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        for ln in e["scale_lines"](ind + "        ", cload, "r, j", f"sr[{slot}, r, j]" if sdt else None,
                                   f"zr[{slot}, r, j]" if zdt else None):
            add(ln)
        add(f"{ind}for r, i in T.grid({R}, {m}):")
        add(f"{ind}    acc[r, i] = T.float32(0)")
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for j in T.unroll({NJ}):")
        ind2 = ind + "        "
        if guard:
            add(f"{ind2}if {cexpr} < {NC}:")
            ind2 += "    "
        add(e["dec_line"](ind2, f"wq.ptr_to([{slot}, r, j, 0])", "ov[r, j]", "dq.ptr_to([0])"))
        add(f"{ind2}for i in T.unroll({m}):")
        tail = " + cv[r, j] * asum[i, j]" if e["need_asum"] else ""
        add(f"{ind2}    acc[r, i] = acc[r, i] + sv[r, j] * "
            f"{e['dot_expr']('dq.ptr_to([0])', 'ap.ptr_to([i, j, 0])')}{tail}")
        add(f"{ind}for r in T.unroll({R}):")
        add(f"{ind}    for i in T.unroll({m}):")
        add(f"{ind}        acc[r, i] = T.cuda.warp_sum(acc[r, i])")
        add(f"{ind}        if lane == 0:")
        add(f"{ind}            red[{slot}, kw, r * {m} + i] = acc[r, i]")
        add(f"{ind}T.cuda.cta_sync()")
        add(f"{ind}if tx < {R * m}:")
        add(f"{ind}    if {n0} + tx // {m} < {N}:")
        tot = " + ".join(f"red[{slot}, {k}, tx]" for k in range(WK))
        add(e["store_line"](ind + "        ", f"tx % {m}", f"{n0} + tx // {m}", f"({tot})"))

    load("    ", "0", 0)                       # the first batch's weights fly during the prologue
    # prologue: this lane's activation vectors, paired for the decoded weights, and their sums
    add(f"    for i in T.unroll({m}):")
    add(f"        for j in T.unroll({NJ}):")
    for ln in e["lda_lines"]("            ", "i", cload, "ar"):
        add(ln)
    add(f"            asum[i, j] = {e['prep_expr']('ar', 'ap.ptr_to([i, j, 0])')}")
    add("    for b2 in T.serial((nbk + 1) // 2):")
    add("        if b2 * 2 + 1 < nbk:")
    load("            ", "b2 * 2 + 1", 1)
    process("        ", "b2 * 2", 0)
    add("        if b2 * 2 + 1 < nbk:")
    add("            if b2 * 2 + 2 < nbk:")
    load("                ", "b2 * 2 + 2", 0)
    process("            ", "b2 * 2 + 1", 1)
