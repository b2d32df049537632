"""The Hopper tensor-core GEMV (``GEMVWgmmaHint``, sm_90a, float activations x int/uint 2-/4-/8-bit
codes, fp4_e2m1, nvfp4, 4-bit tables (nf4) and float8 weights): ``wgmma.mma_async m64nNk16`` with the
*decoded weights in registers* as the 64 x 16 A operand (64 output channels per warpgroup, or 128 as
two tiles) and the activation rows, rounded up to N = 8, 16, .., 64, as the 16 x N B operand, read
by the tensor cores straight from shared memory.

Why: the ``mma.sync`` GEMV (mma) gathers every token tile's activation fragments through
the L1 load pipe, per warp and per weight vector; from ~17 rows that pipe is the limit (ncu:
nearly all of its wavefronts in use). ``wgmma`` reads B from shared memory without
the load pipe, and the TMA engine fills that shared memory, so the only per-lane loads left are
the weights.

The A fragment of ``wgmma`` (per warp, 16 rows) is the ``mma.sync m16n8k16`` one: lane
``(g, q)`` holds channels ``g`` and ``g + 8``, K slots ``2q, 2q+1`` and ``2q+8, 2q+9``. As in
mma, lane ``q`` of a quad streams the 16-byte vectors ``4 * slab + q`` of its channels and
its decoded pairs (``bb_dec``, the mma GEMV's decoder of the format: codes ``lo_i``, ``hi_i`` of
the vector, ``decode.pair_codes``) are the fragment registers as they come: k16 step ``s`` of a
slab takes pairs ``2s`` and ``2s + 1``. A dot product does not care about the order of K, but B
must then hold the activations in the same order. So a small first kernel (``permute``) writes the
activations with each slab of ``4 V`` values (``V`` codes per vector) reordered
(:func:`slab_permutation`, for the format's decoder); the main kernel TMA-loads that copy in boxes of
64 values x N rows (128-byte swizzle) into a ring of shared-memory slots. With programmatic
dependent launch (``pdl``, the sm_90 default) the permute kernel lets the main kernel launch as
soon as it has waited for the kernel before it; the main kernel loads the weights of its first
steps, then waits for the permute kernel before its first TMA.

Per slab, each warpgroup: wait for its wgmma of the previous slab (``wait_group 0``: overlapping
the decode of the next slab with the tensor work of the last makes ptxas serialize every wgmma,
C7513; the other warpgroups of the SM fill the gap), refill that activation slot (one thread,
TMA, up to 4 slots per warpgroup), decode its 2 * ``R`` weight vectors per lane (``stages``
register slots: the loads of later slabs are in flight), wait for the slab's activations
(mbarrier), then ``V / 4`` wgmma per 64-channel tile, one commit group. ``k_warps`` warpgroups
split K (slab ``step * k_warps + kw``) and add their sums through the shared memory of the slots
at the end. Group scales are applied to the decoded pairs (``hfma2``), per-channel scales at the
store, float32 accumulation. Rows past the call's row count are zeros (TMA's out-of-bounds fill)
and not stored; channels past N are clamped on load and not stored.

measurements: docs/performance.md
"""
from __future__ import annotations

from typing import List, Optional

from .decode import decoder, e4m3_code_slots, pair_codes
from ...formats import get_format
from .int8 import byte_gather, word_codes
from .emit import (device_entry, f8_scales, mma_decodable, pdl_trigger, reduce_k_warps, step_loop, vec_blocks,
                   vec_bytes)
from .mma import mma_helpers

__all__ = ["TMA_2D", "BOX", "slab_permutation", "slab_permutation_i8", "act_bytes", "box_values", "slab_codes",
           "weights_unsupported", "wgmma_gemv_unsupported",
           "wgmma_rows", "permute_script", "WgmmaGemvFn",
           "wgmma_helper", "scales_at_store", "acc_loops", "for_accs", "tensor_map", "slab_locals", "init_accs_barriers",
           "vector_channel", "load_vectors", "decode_vectors", "wgmma_wait", "wgmma_slot", "reduce_warpgroups", "store_accs"]

TMA_2D = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
BOX = 64                                # activation values per TMA box row (128 bytes, 128-byte swizzle)
_SMEM_MAX = 200 * 1024                   # activation slots of a block (and the K-split reduction) within sm_90's 227 KB


def slab_permutation(bits: int, nw: int, dec: str, order=None) -> List[int]:
    """``perm[t]``: the natural K position (within a slab of 4 vectors of ``V`` codes) of the
    activation at position ``t`` of the permuted slab. Position ``16 s + 2 q + e + 8 h`` is k16 step
    ``s``'s B row of K slot ``2q + e + 8h``: lane ``q``'s decoded word ``2 s + h``, code ``e`` (the
    codes of each decoded word: :func:`~.decode.pair_codes` of decoder ``dec`` and code order ``order``)."""
    V = nw * 32 // bits
    pairs = pair_codes(dec, bits, nw, order)
    perm = [0] * (4 * V)
    for s in range(V // 4):
        for q in range(4):
            for h in range(2):
                for e in range(2):
                    perm[16 * s + 2 * q + e + 8 * h] = V * q + pairs[2 * s + h][e]
    return perm


def slab_permutation_i8(bits: int, nw: int, order=None, slots=None) -> List[int]:
    """int8 / float8 activations (``wgmma m64nNk32`` on bytes; the fused GEMM): ``perm[t]``, the
    natural K position (within a slab of 4 vectors of ``V`` codes) of the activation at position
    ``t`` of the permuted slab. Position ``32 s + 16 h + 4 q + i`` is k32 step ``s``'s B row of K
    slot ``4q + i + 16h``: byte ``i`` of lane ``q``'s decoded word ``2 s + h`` (the bytes of each
    decoded word: :func:`~.int8.word_codes` of the code order ``order`` and the decoder's
    ``slots``)."""
    V = nw * 32 // bits
    words = word_codes(bits, nw, order, slots)
    perm = [0] * (4 * V)
    for s in range(len(words) // 2):
        for q in range(4):
            for h in range(2):
                for i in range(4):
                    perm[32 * s + 16 * h + 4 * q + i] = V * q + words[2 * s + h][i]
    return perm


def act_bytes(act: str) -> int:
    """Bytes per activation value of the wgmma kernels (float16 / bfloat16, or int8)."""
    return get_format(act, "A", "A_dtype").bits // 8


def box_values(act: str) -> int:
    """Activation values per TMA box row: 128 bytes (the 128-byte swizzle)."""
    return 128 // act_bytes(act)


def slab_codes(bits: int) -> int:
    """K per slab: the 4 16-byte weight vectors of a lane quad (one per lane), 512 // bits codes."""
    return 4 * 16 * 8 // bits


def wgmma_rows(m: int) -> int:
    """The B width (rows of activations) of the kernel serving ``m`` rows: a multiple of 8."""
    return 8 * -(-m // 8)


def weights_unsupported(plan, kernel: str) -> Optional[str]:
    """None when the wgmma kernels (``kernel``: their name in the message) decode the plan's
    weights: the half-pair decoders of the mma GEMV (:func:`~.emit.mma_decodable`) for 2-, 4- and
    8-bit codes (int/uint, fp4_e2m1, 4-bit tables such as nf4, float8), scales (if any) in the
    activation dtype, or nvfp4's float8_e4m3 scales per 16 e2m1 codes (two per 16-byte vector,
    applied per decoded pair: :func:`~.emit.block_scale_helpers`); else why not."""
    c, w = plan.config, plan.w
    if not mma_decodable(w) or w.bits not in (2, 4, 8):
        return (f"W_dtype={c.W_dtype!r}: {kernel} decodes int/uint 2-, 4- and 8-bit codes, fp4_e2m1, 4-bit "
                f"tables (nf4) and float8_e4m3 / float8_e5m2")
    if f8_scales(plan) and (decoder(w) != "e2m1" or c.group_size != 16):
        return (f"W_dtype={c.W_dtype!r}: {kernel} takes float8_e4m3 scales with e2m1 codes in blocks of 16 "
                f"(nvfp4), else scales in the activation dtype")
    return None


def wgmma_gemv_unsupported(plan, hint) -> Optional[str]:
    """None when the wgmma GEMV takes ``plan`` with ``hint``, else why not."""
    c, w = plan.config, plan.w
    if plan.args[0].name != "A":
        return "the wgmma GEMV passes the activations as the first argument"
    if c.A_dtype not in ("float16", "bfloat16"):
        return f"A_dtype={c.A_dtype!r}: the wgmma GEMV takes float16 / bfloat16 activations"
    why = weights_unsupported(plan, "the wgmma GEMV")
    if why:
        return why
    if hint.rows_per_warp not in (16, 32):
        return f"rows_per_warp={hint.rows_per_warp}: the wgmma GEMV takes 16 or 32 (64 or 128 channels per block)"
    if hint.k_warps not in (0, 1, 2, 4):
        return f"k_warps={hint.k_warps}: the wgmma GEMV splits K over 1, 2 or 4 warpgroups (k_warps)"
    if hint.stages < 1:
        return f"stages={hint.stages}: the wgmma GEMV needs at least one weight register slot"
    KW = max(1, hint.k_warps)
    if KW * 2 * _slab_bytes(plan) > _SMEM_MAX:
        return (f"{plan.m} rows, k_warps={hint.k_warps}: two activation slots per warpgroup need "
                f"{KW * 2 * _slab_bytes(plan)} bytes of shared memory, more than {_SMEM_MAX}")
    VB = vec_bytes(plan, hint.vec_bytes, blocks=vec_blocks(plan, hint))
    if VB != 16:
        return f"vec_bytes={hint.vec_bytes}: the wgmma GEMV streams 16-byte weight vectors"
    slab = slab_codes(w.bits) * KW
    if c.K % slab:
        return (f"K={c.K}: the wgmma GEMV needs K to be a multiple of {slab} (4 weight vectors per "
                f"lane quad and warpgroup, k_warps={hint.k_warps})")
    return None


def _perm_groups(perm: List[int], epc: int = 8):
    """(groups, output chunks per group, input chunk stride per group): the permuted slab's 16-byte
    output chunks (``epc`` values each) fall into groups that read the same input chunks; group
    ``J`` is group 0 shifted by ``J`` * (its output chunks) and ``J`` * stride input chunks (every
    decoder's layout)."""
    S = len(perm)
    nout = S // epc
    ins = [sorted({perm[epc * c + x] // epc for x in range(epc)}) for c in range(nout)]
    # group 0: the output chunks that read exactly the inputs of chunk 0
    per = sum(1 for c in range(nout) if ins[c] == ins[0])
    if nout % per or any(ins[c] != ins[0] for c in range(per)):
        return 1, nout, 0
    groups = nout // per
    stride = (ins[per][0] - ins[0][0]) if groups > 1 else 0
    for J in range(groups):
        for t in range(epc * per):
            if perm[epc * per * J + t] != perm[t] + epc * stride * J:
                return 1, nout, 0
    return groups, per, stride


def _perm_helper(perm: List[int], nchunks: int) -> str:
    """``bb_perm(src, dst)``: the first ``nchunks`` 16-byte chunks of a permuted slab (``dst``),
    each a ``__byte_perm`` of the input words (``src``) holding its two values per word."""
    lines = ["__device__ __forceinline__ void bb_perm(const void* src, void* dst) {",
             "  const uint4* s = reinterpret_cast<const uint4*>(src);",
             "  uint4* d = reinterpret_cast<uint4*>(dst);"]
    need = sorted({perm[x] // 8 for x in range(8 * nchunks)})
    for k in need:
        lines.append(f"  const uint4 i{k} = __ldg(s + {k});")

    def word(p):
        return f"i{p // 8}.{'xyzw'[(p % 8) // 2]}"
    for c in range(nchunks):
        words = []
        for wd in range(4):
            a, b = perm[8 * c + 2 * wd], perm[8 * c + 2 * wd + 1]
            sel = (2 * (a % 2)) | ((2 * (a % 2) + 1) << 4) | ((4 + 2 * (b % 2)) << 8) | ((5 + 2 * (b % 2)) << 12)
            words.append(f"__byte_perm({word(a)}, {word(b)}, 0x{sel:x})")
        lines.append(f"  d[{c}] = make_uint4({', '.join(words)});")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def _perm_helper_bytes(perm: List[int], nchunks: int) -> str:
    """int8 activations: ``bb_perm(src, dst)`` as :func:`_perm_helper`, each output word from the
    bytes of up to four input words (:func:`~.int8.byte_gather`)."""
    lines = ["__device__ __forceinline__ void bb_perm(const void* src, void* dst) {",
             "  const uint4* s = reinterpret_cast<const uint4*>(src);",
             "  uint4* d = reinterpret_cast<uint4*>(dst);"]
    for k in sorted({perm[x] // 16 for x in range(16 * nchunks)}):
        lines.append(f"  const uint4 i{k} = __ldg(s + {k});")
    for c in range(nchunks):
        names = []
        for wd in range(4):
            src = [(f"i{p // 16}.{'xyzw'[p % 16 // 4]}", p % 4) for p in perm[16 * c + 4 * wd:16 * c + 4 * wd + 4]]
            for dst, x, y, sel in byte_gather(f"o{c}_{wd}", src):
                rhs = x if x == y and sel == 0x3210 else f"__byte_perm({x}, {y}, 0x{sel:x})"
                lines.append(f"  const unsigned {dst} = {rhs};")
            names.append(f"o{c}_{wd}")
        lines.append(f"  d[{c}] = make_uint4({', '.join(names)});")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


def permute_script(plan, hint) -> str:
    """TVMScript of the ``permute`` kernel: ``P[i, slab] = A[i, slab][perm]`` for every row and slab,
    one thread per group of output chunks that read the same input chunks (:func:`_perm_groups`),
    ``mv`` rows at run time."""
    c, w = plan.config, plan.w
    if c.A_dtype in ("int8", "float8_e4m3"):      # the fused GEMM's byte paths: 16-byte vectors, bytes
        slots = e4m3_code_slots(w.bits) if c.A_dtype == "float8_e4m3" else None
        perm, epc = slab_permutation_i8(w.bits, 4, plan.w_order, slots), 16
        helper = lambda per: _perm_helper_bytes(perm, per)     # noqa: E731
    else:
        nw = vec_bytes(plan, hint.vec_bytes, blocks=vec_blocks(plan, hint)) // 4
        perm, epc = slab_permutation(w.bits, nw, decoder(w), plan.w_order), 8
        helper = lambda per: _perm_helper(perm, per)           # noqa: E731
    S = len(perm)
    NS = c.K // S
    G, per, stride = _perm_groups(perm, epc)
    NT = NS * G                                # threads per row
    L = ["@T.prim_func",
         "def permute(A_ptr: T.handle, P_ptr: T.handle):",
         "    mv = T.int32()",
         f"    A = T.match_buffer(A_ptr, (mv, {c.K}), {plan.arg('A').dtype!r}, align=16)",
         f"    P = T.match_buffer(P_ptr, (mv, {c.K}), {plan.arg('A').dtype!r}, align=16)",
         "    T.device_entry()"]
    if hint.pdl:        # then the main kernel may launch: it loads weights, and waits for this one to finish
        L += ["    T.ptx.griddepcontrol.wait()", "    T.ptx.griddepcontrol.launch_dependents()"]
    L += [f"    bx = T.cta_id([(mv * {NT} + 127) // 128])",
          "    tx = T.thread_id([128])",
          "    i = T.meta_var(bx * 128 + tx)",
          f"    if i < mv * {NT}:",
          f"        T.cuda.func_call('bb_perm', A.ptr_to([i // {NT}, i % {NT} // {G} * {S} + i % {G} * {epc * stride}]), "
          f"P.ptr_to([i // {NT}, i % {NT} // {G} * {S} + i % {G} * {epc * per}]), "
          f"source_code={helper(per)!r})"]
    return "\n".join(L) + "\n"


def wgmma_helper(tag: str, act: str, NT: int, steps: int, box_bytes: int, a_type: str = "s8") -> str:
    """``bb_wg_{tag}(c, dg, dh, desc)``: the ``steps`` k16 wgmma of one slab for one 64-channel
    tile: A = decoded words 2s, 2s+1 of channels g (``dg``) and g+8 (``dh``), B = the slab's
    activation boxes in shared memory (``desc``: the slot's descriptor; +32 bytes per k16 step,
    +``box_bytes`` per box of 4 steps). int8 activations (the fused GEMM; an int8 ``tag``):
    ``bb_wg_{tag}(c, dg, dh, desc, keep)``, k32 steps of ``.s32.{a_type}.s8`` on decoded bytes (4 per word, 32 bytes a
    step as well) into int32 sums ``c`` (as unsigned words); the first step adds to them if ``keep``,
    else overwrites them. float8_e4m3 activations: the same with ``.f32.e4m3.e4m3`` into float32
    sums."""
    i8 = act == "int8"
    b8 = i8 or act == "float8_e4m3"        # k32 steps on bytes, the first one keeping the sums or not
    nacc = NT // 2
    outs = ", ".join(f'"+{"r" if i8 else "f"}"(c[{i}])' for i in range(nacc))
    regs = ", ".join(f"%{i}" for i in range(nacc))
    a0 = nacc
    if i8:
        head = f"bb_wg_{tag}(unsigned* c, const unsigned* dg, const unsigned* dh, unsigned long long desc, int keep)"
        shape, tail = f"m64n{NT}k32.s32.{a_type}.s8", "p"
    elif b8:
        head = f"bb_wg_{tag}(float* c, const unsigned* dg, const unsigned* dh, unsigned long long desc, int keep)"
        shape, tail = f"m64n{NT}k32.f32.e4m3.e4m3", "p, 1, 1"
    else:
        ab = "f16" if act == "float16" else "bf16"
        head = f"bb_wg_{tag}(float* c, const unsigned* dg, const unsigned* dh, unsigned long long desc)"
        shape, tail = f"m64n{NT}k16.f32.{ab}.{ab}", "p, 1, 1, 0"
    lines = [f"__device__ __forceinline__ void {head} {{"]
    for s in range(steps):
        off = ((s // 4) * box_bytes + (s % 4) * 32) >> 4
        lines.append(f"  asm volatile(\"{{ .reg .pred p; setp.ne.b32 p, %{a0 + 5}, 0; "
                     f"wgmma.mma_async.sync.aligned.{shape} "
                     f"{{{regs}}}, {{%{a0}, %{a0 + 1}, %{a0 + 2}, %{a0 + 3}}}, %{a0 + 4}, {tail}; }}\" "
                     f": {outs} : \"r\"(dg[{2 * s}]), \"r\"(dh[{2 * s}]), \"r\"(dg[{2 * s + 1}]), "
                     f"\"r\"(dh[{2 * s + 1}]), \"l\"(desc + {off}ull), \"r\"({'keep' if b8 and s == 0 else 1}));")
    lines.append("}")
    return "\n" + "\n".join(lines) + "\n"


# The emit code the wgmma GEMV (``body``) and the fused GEMM (schedule/fused_wgmma.py) share: ``add``
# takes a line, ``e`` is template ``kernel_script``'s locals; ``unroll``: loops over the accumulators
# unrolled (the fused GEMM's many accumulators: a rolled loop puts them in local memory) or T.grid.

def scales_at_store(plan, e) -> bool:
    """Per-channel scales applied to the sums at the store instead of to the decoded pairs."""
    return plan.config.with_scaling and plan.groups == 1 and not e["float_zeros"]


def acc_loops(ind: str, R: int, NACC: int, unroll: bool = False):
    """(header lines, body indent) of the loops over every accumulator ``acc[r, j]``."""
    if unroll:
        return [f"{ind}for r in T.unroll({R}):", f"{ind}    for j in T.unroll({NACC}):"], ind + "        "
    return [f"{ind}for r, j in T.grid({R}, {NACC}):"], ind + "    "


def for_accs(add, ind: str, stmt: str, R: int, NACC: int, unroll: bool = False):
    """``stmt`` for every accumulator."""
    head, inner = acc_loops(ind, R, NACC, unroll)
    for ln in head:
        add(ln)
    add(inner + stmt)


def tensor_map(add, act: str, K: int, rows: int, name: str = "A_map", box_rows=None):
    """Host: the TMA descriptor ``A_map`` of the permuted activations (dims K x mv, boxes of 128
    bytes (:func:`box_values`) x ``rows``, 128-byte swizzle, L2 promotion 128 B, out-of-bounds rows
    read as zeros); ``act``: the dtype the kernel sees (``plan.arg("A").dtype``: float8 as int8 bits).
    ``name``, ``box_rows``: another map of the same rows with boxes of that many rows (an expression).
    """
    add(f"    {name}: T.let[T.handle('tensormap')] = T.tvm_stack_alloca('tensormap', 1)")
    add(f"    T.call_packed('runtime.cuTensorMapEncodeTiled', {name}, {act!r}, 2, A.data, "
        f"{K}, mv, {K * act_bytes(act)}, {box_values(act)}, {box_rows or rows}, 1, 1, 0, 3, 2, 0)")


def slab_locals(add, words: int, full: int, R: int, NA: int, NACC: int, empty: int = 0, side_by_side: bool = False,
                dq_buffers: int = 1):
    """After :func:`~.emit.device_entry`: one dynamic shared buffer ``Sm`` of ``words`` 4-byte words
    (TVM allows one: the activation slots, later the K warpgroups' sums), ``full`` (and ``empty``)
    mbarriers, the decoded pairs ``dq``, accumulators ``acc``, scale registers, the B descriptor and
    the lane's indices (``cw``: its warpgroup side by side in N, ``kw``: along K, ``t4``: thread in
    its warpgroup). ``dq_buffers=2``: a second set of decoded pairs, ``dq1``."""
    if 47 * 1024 <= 4 * words < 48 * 1024:
        # TVM's runtime raises the block's dynamic shared memory limit only from 48 KB; just below,
        # the barriers' static bytes would push the block past the default and the launch fails
        words = 12 * 1024
    add(f"    Sm = T.alloc_buffer(({words},), 'float32', scope='shared.dyn', align=1024)")
    add(f"    full = T.alloc_shared(({full},), 'uint64')")
    if empty:
        add(f"    empty = T.alloc_shared(({empty},), 'uint64')")
    add(f"    dq = T.alloc_local(({R}, 2, {NA}), 'uint32')")
    if dq_buffers == 2:
        add(f"    dq1 = T.alloc_local(({R}, 2, {NA}), 'uint32')")
    add(f"    acc = T.alloc_local(({R}, {NACC}), 'float32')")
    add("    sv = T.alloc_local((2,), 'float32')")
    add("    cv = T.alloc_local((2,), 'float32')")
    add("    ov = T.alloc_local((2,), 'int32')")
    add("    descB: T.uint64")
    add("    g = T.meta_var(tx % 32 // 4)")
    add("    q = T.meta_var(tx % 4)")
    add("    wp = T.meta_var(tx % 128 // 32)")
    if side_by_side:
        add("    cw = T.meta_var(tx // 128)")
    add("    kw = T.meta_var(tx // 128)")
    add("    t4 = T.meta_var(tx % 128)")


def init_accs_barriers(add, R: int, NACC: int, full: int, empty: int = 0, arrivals: int = 1, unroll: bool = False):
    """Zero the accumulators; thread 0 initialises the ``full`` mbarriers (one arrival: the TMA
    thread's) and the ``empty`` ones (``arrivals``: one per warpgroup reading a slot); then the
    block syncs."""
    for_accs(add, "    ", "acc[r, j] = T.float32(0)", R, NACC, unroll)
    add("    if tx == 0:")
    add(f"        for s in T.unroll({full}):")
    add("            T.ptx.mbarrier.init.shared.b64(full.ptr_to([s]), T.uint32(1))")
    if empty:
        add(f"        for s in T.unroll({empty}):")
        add(f"            T.ptx.mbarrier.init.shared.b64(empty.ptr_to([s]), T.uint32({arrivals}))")
    add("    T.ptx.fence.proxy.async_.shared__cta()")
    add("    T.cuda.cta_sync()")


def vector_channel(plan, e) -> str:
    """The output channel of weight vector ``h`` of tile ``r`` in the lane, clamped to N."""
    return f"T.min(n0 + r * 64 + wp * 16 + h * 8 + g, {e['N'] - 1})"


def load_vectors(add, plan, e, ind: str, R: int, cidx: str, ws: str):
    """Load the lane's 2 * ``R`` weight vectors ``cidx`` (channels g, g + 8 of each tile) and their
    raw scales / zeros into register slot ``ws``."""
    add(f"{ind}for r, h in T.grid({R}, 2):")
    for ln in e["load_lines"](ind + "    ", vector_channel(plan, e), cidx, f"{ws}, r, h", not scales_at_store(plan, e)):
        add(ln)


def decode_vectors(add, plan, e, ind: str, R: int, cidx: str, ws: str, dq: str = "dq"):
    """Decode register slot ``ws`` (vectors ``cidx``) into the A fragments ``dq`` (the buffer's
    name), group scales and float zeros applied to the pairs (``hfma2``)."""
    c, tag, sdt, zdt = plan.config, e["tag"], e["sdt"], e["zdt"]
    at_store = scales_at_store(plan, e)
    add(f"{ind}for r, h in T.grid({R}, 2):")
    ind1 = ind + "    "
    s_raw = "T.float32(1)" if at_store else (f"sr[{ws}, r, h]" if sdt else None)
    for ln in e["scale_lines"](ind1, cidx, "h", s_raw, f"zr[{ws}, r, h]" if zdt else None):
        add(ln)
    add(e["dec_line"](ind1, f"wq.ptr_to([{ws}, r, h, 0])", "ov[h]", f"{dq}.ptr_to([r, h, 0])"))
    if e["SB"] > 1:                           # nvfp4: the two blocks' float8 scales per decoded pair
        add(f"{ind1}T.cuda.func_call('bb_sclb_{tag}', {dq}.ptr_to([r, h, 0]), sr[{ws}, r, h], "
            f"source_code={e['helpers'][f'bb_sclb_{tag}']!r})")
    elif (c.with_scaling or e["float_zeros"]) and not at_store:
        # e["scl"]: another (name, source) of the same signature (the fused GEMM's natural order)
        name, scl = e.get("scl") or (f"bb_scl_{tag}", mma_helpers(tag, c.A_dtype, e["NA"])[f"bb_scl_{tag}"])
        add(f"{ind1}T.cuda.func_call({name!r}, {dq}.ptr_to([r, h, 0]), sv[h], cv[h], "
            f"source_code={scl!r})")


def wgmma_wait(add, ind: str, R: int, NACC: int, unroll: bool = False, pending: int = 0, acc: str = "acc"):
    """Wait for all of this warpgroup's wgmma but the last ``pending`` commit groups; with none
    pending the accumulators (``acc``) are defined again (with some, they stay the wgmma's)."""
    add(f"{ind}T.ptx.wgmma.wait_group.sync.aligned({pending})")
    if not pending:
        for_accs(add, ind, f"T.cuda.wgmma.noop_barrier({acc}[r, j])", R, NACC, unroll)


def wgmma_slot(add, ind: str, slot: str, phase: str, words: int, R: int, NACC: int, wsrc: str, tag: str,
               pair0: int = 0, unroll: bool = False, dq: str = "dq", acc: str = "acc", extra: str = ""):
    """Wait for the activations of ring slot ``slot`` (``full`` mbarrier, ``phase``), point the B
    descriptor at its ``words`` words of ``Sm`` and issue ``bb_wg_{tag}`` (``wsrc``: its source's
    repr; ``extra``: arguments after the descriptor) per 64-channel tile on the decoded words from
    ``pair0``, into accumulators ``acc``."""
    add(f"{ind}T.cuda.mbarrier_wait(full.ptr_to([{slot}]), {phase})")
    add(f"{ind}T.cuda.wgmma.encode_matrix_descriptor(T.address_of(descB), "
        f"Sm.ptr_to([({slot}) * {words}]), 1, 64, 3)")
    for_accs(add, ind, f"T.cuda.wgmma.noop_barrier({acc}[r, j])", R, NACC, unroll)
    add(f"{ind}T.ptx.wgmma.fence.sync.aligned()")
    add(f"{ind}for r in T.unroll({R}):")
    add(f"{ind}    T.cuda.func_call('bb_wg_{tag}', {acc}.ptr_to([r, 0]), {dq}.ptr_to([r, 0, {pair0}]), "
        f"{dq}.ptr_to([r, 1, {pair0}]), descB{f', {extra}' if extra else ''}, source_code={wsrc})")


def reduce_warpgroups(add, KW: int, R: int, NACC: int, unroll: bool = False) -> str:
    """The ``KW`` warpgroups splitting K, each past its ring, add their sums through ``Sm``; returns
    the indent of the store."""
    if KW == 1:
        return "    "
    add("    T.cuda.cta_sync()")
    return reduce_k_warps(add, KW, "r, j", f"{R}, {NACC}", "acc[r, j]",
                          lambda k: f"Sm[(({k}) * {R * NACC} + r * {NACC} + j) * 128 + t4]",
                          loops=lambda ind: acc_loops(ind, R, NACC, unroll))


def store_accs(add, plan, e, ind: str, R: int, NACC: int, row0: str = "", unroll: bool = False):
    """Store every accumulator in range: accumulator j of tile r is channel
    n0 + r*64 + wp*16 + g + 8*(j % 4 // 2), row ``row0`` + (j // 4) * 8 + 2q + j % 2."""
    ch = "n0 + r * 64 + wp * 16 + g + (j % 4 // 2) * 8"
    row = f"{row0}j // 4 * 8 + q * 2 + j % 2"
    val = "acc[r, j]"
    if scales_at_store(plan, e) and plan.float_acts:      # int8: the store line's epilogue applies it
        val = f"{val} * T.Cast('float32', scale[{ch}, 0])"
    head, inner = acc_loops(ind, R, NACC, unroll)
    for ln in head:
        add(ln)
    add(f"{inner}if {row} < mv and {ch} < {e['N']}:")
    add(e["store_line"](inner + "    ", row, ch, val))


def _slab_bytes(plan) -> int:
    """Shared-memory bytes of one slab of activations (float16 / bfloat16) for the plan's rows."""
    return wgmma_rows(plan.m) * slab_codes(plan.w.bits) * 2


def _stages(plan, hint) -> int:
    """Shared-memory slots of activations per warpgroup: up to 4, within ~110 KB per block (two
    blocks per SM)."""
    KW = max(1, hint.k_warps)
    return max(2, min(4, (110 * 1024) // (KW * _slab_bytes(plan))))


def body(plan, hint, add, e):
    """The main kernel (see the module docstring); ``e``: template ``kernel_script``'s locals.
    ``k_warps`` warpgroups split K (slab ``step * k_warps + kw``), each with its own ring, and meet
    in shared memory at the end."""
    c = plan.config
    why = wgmma_gemv_unsupported(plan, hint)
    if why:
        raise ValueError(f"{hint}: {why}")
    m, N, K, NW, NA = e["m"], e["N"], c.K, e["NW"], e["NA"]
    tag = e["tag"]
    NT = wgmma_rows(m)
    R = hint.rows_per_warp // 16              # 64-channel tiles per warpgroup
    KW = max(1, hint.k_warps)                 # warpgroups splitting K
    SL = slab_codes(plan.w.bits)              # K per slab
    V = SL // 4                               # codes per vector
    NSW = K // SL // KW                       # slabs per warpgroup
    BOXES = SL // BOX
    STEPS = V // 4                            # k16 steps per slab
    STG = _stages(plan, hint)
    STW = max(1, min(hint.stages, NSW))       # weight register slots
    NACC = NT // 2
    box_bytes = NT * BOX * 2
    slot_el = BOXES * NT * BOX
    NBLK = -(-N // (64 * R))
    at_store = scales_at_store(plan, e)
    wsrc = repr(wgmma_helper(tag, c.A_dtype, NT, STEPS, box_bytes))

    tensor_map(add, plan.arg("A").dtype, K, NT)
    # programmatic dependent launch: the weights (and scales) of the first steps are loaded before
    # waiting for the permute kernel; no kernel of this stream writes them while it runs
    device_entry(add, hint, NBLK, 128 * KW, (STW, R, 2), NW, None if at_store else e["sdt"], e["zdt"], wait=False)
    SW = slot_el // 2                         # words per slot
    slab_locals(add, max(KW * STG * SW, (KW - 1) * R * NACC * 128), KW * STG, R, NA, NACC)
    add(f"    n0 = T.meta_var(bx * {64 * R})")
    init_accs_barriers(add, R, NACC, KW * STG)

    def slot(step):
        return f"kw * {STG} + ({step}) % {STG}"

    def tma(ind, step):
        add(f"{ind}T.ptx.mbarrier.arrive.expect_tx.shared.b64(full.ptr_to([{slot(step)}]), "
            f"T.uint32({BOXES * box_bytes}))")
        for b in range(BOXES):
            add(f"{ind}T.ptx[{TMA_2D!r}](Sm.ptr_to([({slot(step)}) * {SW} + {b * NT * BOX // 2}]), T.address_of(A_map), "
                f"(({step}) * {KW} + kw) * {SL} + {b * BOX}, 0, full.ptr_to([{slot(step)}]))")

    def first_activations():                  # after the weight loads of the ring's first steps
        if hint.pdl:
            add("    T.ptx.griddepcontrol.wait()")
        add("    if t4 == 0:")
        for s in range(min(STG - 1, NSW)):
            tma("        ", str(s))

    def cidx(step):
        return f"((({step}) * {KW} + kw) * 4 + q)"

    def load(ind, step, ws):
        load_vectors(add, plan, e, ind, R, cidx(step), ws)

    def process(ind, step, ws):
        # all of this warpgroup's wgmma are done: the decoded registers and the activation slot of
        # step - 1 are free (waiting for all of them: ptxas serializes wgmma whose input registers
        # other instructions define while a group is in flight; other warpgroups fill the gap)
        wgmma_wait(add, ind, R, NACC)
        add(f"{ind}T.cuda.warpgroup_sync(kw + 1)")
        add(f"{ind}if t4 == 0 and ({step}) + {STG - 1} < {NSW}:")
        tma(ind + "    ", f"({step}) + {STG - 1}")
        decode_vectors(add, plan, e, ind, R, cidx(step), ws)
        wgmma_slot(add, ind, slot(step), f"(({step}) // {STG}) % 2", SW, R, NACC, wsrc, tag)
        add(f"{ind}T.ptx.wgmma.commit_group.sync.aligned()")

    step_loop(add, NSW, STW, load, process, after_prologue=first_activations)
    wgmma_wait(add, "    ", R, NACC)
    pdl_trigger(add, hint)
    # every warpgroup is past its ring: its words hold the sums
    store_accs(add, plan, e, reduce_warpgroups(add, KW, R, NACC), R, NACC)


class WgmmaGemvFn:
    """The callable of a wgmma GEMV module (arguments in ``plan.args`` order, the activations
    first): the ``permute`` kernel writes the reordered activations into a temporary buffer
    (torch's caching allocator, rows x K values), then ``main`` runs on it."""

    # both kernels check their arguments before launching, and permute writes only its temporary:
    # a refused call has written nothing of the caller's (ops.matmul._checks_args)
    checks_args = True

    def __init__(self, permute, main):
        self.permute = permute
        self.main = main

    def __call__(self, *args):
        import torch
        a = args[0]
        p = torch.empty_like(a)
        self.permute(a, p)
        self.main(p, *args[1:])
