"""Print the constant tables of include/fastadam/lowp.h (run once; its output is pasted there).

    python tests/lowp_tables.py > /tmp/tables.h

The four quantization maps of the 8-bit states, computed in float64 and rounded to float32 as
docs of issue 24 define them (dynamic: bitsandbytes' create_dynamic_map(signed,
max_exponent_bits=7, total_bits=8); linear: (c - 127) / 127 or c / 255), and per map its 256
float32 search thresholds: T[k] = the largest float32 <= (map[k] + map[k+1]) / 2 in float64,
k = 0..254, and T[255] = FLT_MAX, so that for every float32 q the code
    #{k : q > (map[k] + map[k+1]) / 2} == #{k : q > T[k]}.
tests/test_lowp_kernels.py checks the header's tables against tests/lowp_reference.py.
"""
import numpy as np


def dynamic_map(signed):
    s = 0 if signed else 1
    data = [0.0, 1.0]
    for i in range(7):
        b = np.linspace(0.1, 1, 2 ** (i + s) + 1)
        means = (b[:-1] + b[1:]) / 2.0
        data += list(10 ** (i - 6) * means)
        if signed:
            data += list(-(10 ** (i - 6)) * means)
    return np.sort(np.array(data, np.float64)).astype(np.float32)


def linear_map(signed):
    c = np.arange(256, dtype=np.float64)
    if signed:
        v = (c - 127) / 127
        v[255] = 1.0
    else:
        v = c / 255
    return v.astype(np.float32)


def thresholds(m):
    m64 = m.astype(np.float64)
    mid = (m64[:-1] + m64[1:]) / 2
    t = mid.astype(np.float32)
    up = t.astype(np.float64) > mid  # rounded up: step down one float32
    t[up] = np.nextafter(t[up], np.float32(-np.inf))
    return np.append(t, np.finfo(np.float32).max)


def c_table(name, values):
    rows = [", ".join(f"{float(v):.9e}f" for v in values[i:i + 4]) for i in range(0, 256, 4)]
    return f"FA_LOWP_TABLE float {name}[256] = {{\n    " + ",\n    ".join(rows) + "};\n"


def main():
    maps = [("fa_lowp_dynamic_signed", dynamic_map(True)),
            ("fa_lowp_dynamic_unsigned", dynamic_map(False)),
            ("fa_lowp_linear_signed", linear_map(True)),
            ("fa_lowp_linear_unsigned", linear_map(False))]
    for name, m in maps:
        assert m.shape == (256,) and np.all(np.diff(m) >= 0)
        print(c_table(name, m))
    for name, m in maps:
        print(c_table(name + "_t", thresholds(m)))


if __name__ == "__main__":
    main()
