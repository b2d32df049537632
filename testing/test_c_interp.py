"""The tests' interpreter of generated CUDA helpers (testing/c_interp.py): each form it knows on a
small hand-written helper with known results, and refusal of forms it does not know."""
import pytest

from c_interp import U4, Ptr, dp4a, i32, run_c


def test_statements_and_asm():
    src = """__device__ __forceinline__ int t(const unsigned* w, unsigned* d, const unsigned* a) {
  const unsigned x = w[0] ^ 0x88888888u, y = (w[1] << 4) & 0xf0f0f0f0u;
  unsigned m0, m1;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m0) : "r"(x), "r"(y), "r"(0x5410u));
  asm("lop3.b32 %0, %1, 0x0f0f0f0f, 0x64006400, 0xea;" : "=r"(m1) : "r"(w[0] >> 4));
  d[0] = m0; d[1] = m1;
  d[2] = __byte_perm(a[0], a[1], 0x6420);
  int s = 0;
  asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(s) : "r"(a[0]), "r"(a[1]));
  s = __dp4a((int)a[0], 0x01010101, s);
  return -16 * s;
}"""
    w, a = [0x12345678, 0x9ABCDEF0], [0x80FF017F, 0x01020304]
    env = run_c(src, {"w": w, "d": {}, "a": a})
    x, y = w[0] ^ 0x88888888, (w[1] << 4) & 0xF0F0F0F0
    assert env["d"][0] == (x & 0xFFFF) | ((y & 0xFFFF) << 16)
    assert env["d"][1] == (((w[0] >> 4) & 0x0F0F0F0F) | 0x64006400)
    assert env["d"][2] == 0x0204FF7F                      # bytes 0, 2 of a0 then of a1
    s = dp4a(a[0], a[1], 0)
    s = dp4a(a[0], 0x01010101, s)
    assert env["return"] == i32(-16 * s)


def test_floats_and_uint4():
    src = """__device__ __forceinline__ float t(const void* src, void* dst, float acc) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const uint4 i1 = __ldg(s + 1);
  d[0] = make_uint4(i1.w, i1.z, i1.y, i1.x);
  int p = 3, n = 5;
  acc = fmaf((float)(p - n), 0.5f, acc);
  return acc;
}"""
    out = {}
    env = run_c(src, {"src": Ptr([U4(1, 2, 3, 4), U4(5, 6, 7, 8)]), "dst": Ptr(out), "acc": 0.25})
    assert out[0] == U4(8, 7, 6, 5) and env["return"] == -0.75


@pytest.mark.parametrize("line", ["  d[0] = w[0] / 3;", "  asm(\"shf.l.wrap.b32 %0, %1, %2, 4;\" : \"=r\"(d[0]) : "
                                  "\"r\"(w[0]), \"r\"(w[1]));", "  if (w[0]) d[0] = 1;"])
def test_unknown_forms_fail(line):
    src = "__device__ __forceinline__ void t(const unsigned* w, unsigned* d) {\n" + line + "\n}"
    with pytest.raises(AssertionError):
        run_c(src, {"w": [1, 2], "d": {}})
