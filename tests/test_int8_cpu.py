"""int8 that is right on every CPU: the recipe, the CPU detection, the runtime's warning,
and the AVX2 kernels themselves, run under emulation whatever CPU runs the tests."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vit_deploy.runtime.contract import COSINE_MIN
from vit_deploy.parity import metrics, sample_inputs
from vit_deploy.precisions.quantize import QuantOptions, quantize_model
from vit_deploy.runtime import cpu
from vit_deploy.runtime.manifest import load_manifest
from vit_deploy.runtime.manifest_parts import FileEntry
from vit_deploy.runtime.session import ViTSession

PROBE = Path(__file__).with_name("int8_probe.py")
QEMU = "qemu-x86_64"

# /proc/cpuinfo flags lines as these CPUs print them (abridged to what matters)
CPUS = {
    "amd-epyc-avx2": ("x86_64", "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2 sha_ni",
                      "x86 AVX2 without VNNI (saturating 16-bit sums)", False),
    "intel-xeon-amx": ("x86_64", "sse4_2 avx avx2 avx512f avx512bw avx512_vnni avx_vnni "
                       "amx_bf16 amx_tile amx_int8", "x86 AMX (32-bit sums)", True),
    "amd-zen4": ("x86_64", "sse4_2 avx avx2 avx512f avx512bw avx512_vnni avx512_bf16",
                 "x86 VNNI (32-bit sums)", True),
    "intel-alder-lake": ("x86_64", "sse4_2 avx avx2 avx_vnni", "x86 VNNI (32-bit sums)", True),
    "old-x86-sse": ("x86_64", "fpu sse sse2 ssse3 sse4_1 sse4_2", "x86 without AVX2 (32-bit sums)",
                    True),
    "raspberry-pi-5": ("aarch64", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp",
                       "arm64 (32-bit sums)", True),
    "apple-m": ("arm64", "", "arm64 (32-bit sums)", True),
}


@pytest.mark.parametrize("name", list(CPUS))
def test_cpu_detection_per_cpu(name):
    machine, flags, kernel, vnni_ok = CPUS[name]
    key = "Features" if machine in cpu.ARM64_MACHINES else "flags"
    parsed = cpu.parse_cpuinfo(f"processor\t: 0\nmodel name\t: x\n{key}\t\t: {flags}\n")
    assert parsed == frozenset(flags.split())
    assert cpu.int8_kernel(machine, parsed) == kernel
    assert cpu.meets("vnni", machine, parsed) is vnni_ok
    assert cpu.meets("any", machine, parsed) is True  # the portable recipe: everywhere


def test_cpu_detection_when_the_os_does_not_say(monkeypatch):
    monkeypatch.setattr(cpu, "cpu_flags", lambda: None)  # not Linux: no /proc/cpuinfo
    assert cpu.meets("vnni", "x86_64") is None
    assert cpu.meets("vnni", "aarch64") is True  # ARM64's kernels: whatever the flags
    assert cpu.meets("vnni", "riscv64", frozenset()) is None
    assert cpu.meets("any", "riscv64") is True
    with pytest.raises(ValueError, match="one of .*'any', 'vnni'.* got 'avx9'"):
        cpu.meets("avx9")


def _int8_weights(path: Path) -> list[np.ndarray]:
    """Every int8 weight tensor the quantised linear layers multiply by."""
    model = onnx.load(str(path))
    consumers = {i for n in model.graph.node if n.op_type in ("MatMulInteger", "DequantizeLinear")
                 for i in n.input}
    return [numpy_helper.to_array(t) for t in model.graph.initializer
            if t.name in consumers and t.data_type == onnx.TensorProto.INT8 and t.dims]


def _quantise(fp32: Path, dst: Path, precision: str, cpu_kind: str) -> Path:
    calibration = [sample_inputs((48, 64), 2, seed=s) for s in range(3)]
    return quantize_model(fp32, dst, precision=precision, options=QuantOptions(cpu=cpu_kind),
                          calibration=calibration if precision == "int8-static" else None).path


@pytest.mark.parametrize("precision", ["int8", "int8-static"])
def test_portable_weights_cannot_saturate_16_bit_pair_sums(tiny_bundle, tmp_path, precision):
    """u8 activations (static int8's s8 ones are shifted to u8 on x86) times s8 weights,
    two products per 16-bit sum: |w| <= 64 keeps 2 * 255 * 64 = 32640 under 32767."""
    _, result = tiny_bundle
    portable = _int8_weights(_quantise(result.path / "model.onnx", tmp_path / "any.onnx",
                                       precision, "any"))
    full = _int8_weights(_quantise(result.path / "model.onnx", tmp_path / "vnni.onnx",
                                   precision, "vnni"))
    assert len(portable) == len(full) >= 8  # 4 linear layers x 2 blocks (+ head)
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in portable) <= 64
    assert all(2 * 255 * int(np.abs(w.astype(np.int32)).max()) <= 32767 for w in portable)
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in full) > 64  # 8 bits: can clip


def _with_recipe(bundle: Path, tmp: Path, cpu_kind: str | None) -> Path:
    """A copy of the bundle whose int8 model's recipe records `cpu_kind` (None: a file
    written before the recipe said, with 8-bit weights)."""
    out = tmp / f"b-{cpu_kind}"
    shutil.copytree(bundle, out)
    _quantise(out / "model.onnx", out / "model.int8.onnx", "int8", cpu_kind or "vnni")
    recipe = {"kind": "dynamic"} | ({} if cpu_kind is None else {"cpu": cpu_kind})
    manifest = load_manifest(out).with_precision(
        "int8", "model.int8.onnx", FileEntry.of(out / "model.int8.onnx", "model:int8"),
        {"recipe": recipe})
    manifest.save(out)
    return out


@pytest.mark.parametrize("flags,machine,warns", [
    (CPUS["amd-epyc-avx2"][1], "x86_64", "saturates them"),
    (CPUS["intel-xeon-amx"][1], "x86_64", None),
    (CPUS["raspberry-pi-5"][1], "aarch64", None),
    (None, "x86_64", "cannot tell"),
])
@pytest.mark.parametrize("cpu_kind", ["vnni", "any", None])
def test_runtime_warns_where_the_cpu_lacks_what_the_recipe_needs(
        tiny_bundle, tmp_path_factory, monkeypatch, flags, machine, warns, cpu_kind):
    _, result = tiny_bundle
    bundle = _with_recipe(result.path, tmp_path_factory.mktemp("recipe"), cpu_kind)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: None if flags is None
                        else frozenset(flags.split()))
    monkeypatch.setattr(platform, "machine", lambda: machine)
    expected = None if cpu_kind == "any" else warns  # old files: 8-bit weights
    assert load_manifest(bundle).int8_cpu("int8") == (cpu_kind or "vnni")
    assert load_manifest(bundle).int8_cpu("fp32") is None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ViTSession(bundle, precision="int8") as s:
            assert (s.cpu_warning is None) == (expected is None)
        ViTSession(bundle, precision="fp32").close()  # fp32 never warns
    texts = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    if expected is None:
        assert not any("int8" in t for t in texts), texts
    else:
        assert len([t for t in texts if expected in t]) == 1, texts


# -- the AVX2 kernels, run --------------------------------------------------------------
def _emulate(tmp: Path, files: list[Path], inputs: dict[str, np.ndarray], *,
             emulated: bool) -> tuple[dict[str, np.ndarray], dict]:
    np.savez(tmp / "inputs.npz", **inputs)
    job = tmp / "job.json"
    job.write_text(json.dumps({"files": [str(f) for f in files], "inputs": str(tmp / "inputs.npz"),
                               "outputs": str(tmp / "outputs.npz")}))
    prefix = [shutil.which(QEMU), "-cpu", "Haswell"] if emulated else []
    r = subprocess.run([*prefix, sys.executable, str(PROBE), str(job)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    out = np.load(tmp / "outputs.npz")
    return {k: out[k] for k in out.files}, report


@pytest.fixture(scope="module")
def qemu():
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("emulates an x86 CPU with AVX2 only: meaningful on x86-64 hosts")
    if shutil.which(QEMU) is None:
        pytest.fail(f"{QEMU} is missing: this test needs Debian's qemu-user package (make "
                    f"setup installs it as root)")
    return QEMU


@pytest.mark.heavy
def test_portable_int8_is_right_on_the_avx2_kernels(tiny_bundle, tmp_path, qemu):
    """Under `qemu-x86_64 -cpu Haswell` ONNX Runtime runs its AVX2 int8 kernels (the probe
    proves they saturate). There, both portable int8 files of both tiny models pass the
    int8 policy and agree with this CPU's run; the 8-bit file is the issue's failure."""
    _, result = tiny_bundle
    fp32 = result.path / "model.onnx"
    files = [fp32] + [_quantise(fp32, tmp_path / f"{p}-{c}.onnx", p, c)
                      for p in ("int8", "int8-static") for c in ("any", "vnni")]
    inputs = {f"{h}x{w}": sample_inputs((h, w), 2, seed=5)
              for h, w in [(48, 64), (32, 32), (64, 48), (8, 8)]}
    native, _ = _emulate(tmp_path, files, inputs, emulated=False)
    avx2, report = _emulate(tmp_path, files, inputs, emulated=True)
    sat = report["saturation"]
    assert sat["got"] < sat["exact"], f"the emulated CPU did not run the AVX2 kernels: {sat}"
    for key in inputs:
        ref = native[f"0/{key}"]
        for i, name in [(1, "int8 any"), (3, "int8-static any")]:
            here = metrics(ref, native[f"{i}/{key}"])
            there = metrics(ref, avx2[f"{i}/{key}"])
            # integer sums are exact on both CPUs: only float rounding differs
            assert metrics(native[f"{i}/{key}"], avx2[f"{i}/{key}"])["max_rel"] < 1e-4, (name, key)
            if name.startswith("int8 "):  # dynamic int8: judged by the policy on random inputs
                assert min(here["cosine"], there["cosine"]) >= COSINE_MIN["int8"], (name, key)
    if result.path.name.endswith("factorized-mean"):  # the model that failed on AVX2 CPUs
        worst = min(metrics(native[f"0/{k}"], avx2[f"2/{k}"])["cosine"] for k in inputs)
        assert worst < COSINE_MIN["int8"], f"8-bit weights on AVX2: cosine {worst}"


@pytest.mark.parametrize("cpu_kind", ["any", "vnni"])
def test_quantize_cli_records_the_cpus_and_info_says_so(tiny_bundle, tmp_path, monkeypatch,
                                                         cpu_kind):
    from click.testing import CliRunner

    from vit_deploy.cli import main

    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    # 8-bit weights fail the int8 policy on a CPU that saturates them (AVX2 only: cosine
    # 0.974 on the factorized-mean model under qemu -cpu Haswell): --force writes the file
    # anyway, so the recipe is recorded on every CPU; exit 0 wherever it is exact.
    exact_here = cpu.meets(cpu_kind)
    r = CliRunner().invoke(main, ["quantize", str(bundle), "--precision", "int8",
                                  "--int8-cpu", cpu_kind, "--force"])
    if exact_here:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code in (0, 1) and cpu_kind == "vnni", r.output
        assert r.exit_code == 0 or "written anyway: --force" in r.output, r.output
    manifest = load_manifest(bundle)
    recipe = manifest.recipe("int8")
    assert (recipe["cpu"], recipe["reduce_range"]) == (cpu_kind, cpu_kind == "any")
    assert recipe["weights"].endswith("7-bit range" if cpu_kind == "any" else "8-bit range")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(CPUS["amd-epyc-avx2"][1].split()))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    r = CliRunner().invoke(main, ["info", str(bundle)], terminal_width=400)
    assert r.exit_code == 0, r.output
    assert f"int8: exact on {cpu.REQUIREMENT_TEXT[cpu_kind]}" in " ".join(r.output.split())
    assert ("NOT exact here" in r.output) == (cpu_kind == "vnni")

    # An edge target's int8 bucket graphs follow the bundle's recipe, and say so. What the
    # quantiser was given and wrote is seen as it is written (on a CPU that saturates 8-bit
    # weights a `vnni` graph then fails its parity and is not kept: the recipe's warning).
    import vit_deploy.targets.build as targets

    monkeypatch.undo()  # this CPU as it is
    quantised = []

    def spy(src, dst, *, precision, options, calibration=None, **kw):
        done = quantize_model(src, dst, precision=precision, options=options,
                              calibration=calibration, **kw)
        weights = _int8_weights(Path(dst))
        quantised.append((options.cpu, max(int(np.abs(w.astype(np.int32)).max()) for w in weights),
                          options.smooth, calibration is not None))
        return done

    # the bucket graphs are smoothed as the bundle's int8 file was (its recipe's alpha, the
    # statistics taken on calibration images at the bucket's size)
    alpha = load_manifest(bundle).recipe("int8")["smoothing"]["alpha"]
    monkeypatch.setattr(targets, "quantize_model", spy)
    r = CliRunner().invoke(main, ["target", str(bundle), "--target", "cpu", "--buckets", "48x64",
                                  "--quiet"])
    ((given, largest, smooth, calibrated),) = quantised
    assert given == cpu_kind and (largest <= 64) == (cpu_kind == "any")
    assert smooth == alpha and calibrated == (alpha is not None)
    if exact_here:
        assert r.exit_code == 0, r.output
    if r.exit_code == 0:
        record = load_manifest(bundle).target("cpu").record
        assert record["int8_cpu"] == {"int8": cpu_kind}
        assert record.get("smoothing", {}) == ({} if alpha is None else {"int8": alpha})
    else:
        assert r.exit_code == 1 and cpu_kind == "vnni" and not exact_here, r.output


RECIPES = json.loads((Path(__file__).parent / "data" / "int8-recipes.json").read_text())["cases"]


@pytest.mark.parametrize("case", RECIPES, ids=[c["name"] for c in RECIPES])
def test_the_typed_int8_recipe_reads_every_manifest_as_javascript_does(case):
    """One table (tests/data/int8-recipes.json), run here and by web/test/int8cpu.test.mjs:
    the two runtimes read the same fields with the same rules; what is read writes back the
    same, and the options a bucket graph gets follow it."""
    from vit_deploy.runtime.recipe import Int8Recipe

    recipe = Int8Recipe.read(case["recipe"])
    expect = case["expect"]
    if expect is None:
        assert recipe is None
        return
    got = {f: getattr(recipe, f) for f in ("kind", "cpu", "calibration", "percentile",
                                           "smoothing", "needs", "new_graph_cpu")}
    got |= {"quantised_layers": list(recipe.quantised_layers),
            "kept_float_layers": list(recipe.kept_float_layers)}
    assert got == expect
    assert Int8Recipe.read(recipe.record()) == recipe  # written and read in one place
    options = QuantOptions.following(recipe, ["blocks.0.attn.qkv", "blocks.0.mlp.fc1", "head"])
    assert options.cpu == expect["new_graph_cpu"]
    assert options.smooth == expect["smoothing"]
    assert options.calibration == (expect["calibration"] or "minmax")
    assert options.head == ("head" not in expect["kept_float_layers"])
    written = options.int8_recipe("int8-static" if recipe.static else "int8", [], [])
    assert (written.cpu, written.smoothing) == (options.cpu, options.smooth)


@pytest.mark.parametrize("claim", [None, "avx9", ["vnni"], {"cpu": "vnni"}, 8])
def test_a_target_of_a_bundle_whose_recipe_does_not_say_vnni_gets_portable_weights(
        tiny_bundle, tmp_path, monkeypatch, claim):
    """A recipe that does not say `vnni` in so many words (an old file, or a manifest edited
    by hand) never gets 8-bit bucket graphs: the warning reads such a file as 8-bit, the
    quantiser takes the safe side."""
    import vit_deploy.targets.build as targets
    from vit_deploy.targets.build import TargetOptions, add_target

    _, result = tiny_bundle
    bundle = tmp_path / "b"
    shutil.copytree(result.path, bundle)
    _quantise(bundle / "model.onnx", bundle / "model.int8.onnx", "int8", "any")
    recipe = {"kind": "dynamic", "reduce_range": True} | ({} if claim is None else {"cpu": claim})
    load_manifest(bundle).with_precision(
        "int8", "model.int8.onnx", FileEntry.of(bundle / "model.int8.onnx", "model:int8"),
        {"recipe": recipe}).save(bundle)
    given = []

    def spy(src, dst, *, precision, options, calibration=None):
        given.append(options.cpu)
        return quantize_model(src, dst, precision=precision, options=options,
                              calibration=calibration)

    monkeypatch.setattr(targets, "quantize_model", spy)
    report = add_target(bundle, TargetOptions(target="cpu", buckets=((48, 64),)))
    assert given == ["any"]
    assert report and load_manifest(bundle).target("cpu").record["int8_cpu"] == {"int8": "any"}
    (graph,) = [g for g in load_manifest(bundle).target("cpu").graphs if g.precision == "int8"]
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in _int8_weights(bundle / graph.file)) <= 64


def test_quantize_cli_refuses_an_unknown_cpu(tiny_bundle):
    from click.testing import CliRunner

    from vit_deploy.cli import main

    _, result = tiny_bundle
    r = CliRunner().invoke(main, ["quantize", str(result.path), "--precision", "int8",
                                  "--int8-cpu", "avx9"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert all(part in r.output for part in ("--int8-cpu", "'avx9'", "any", "vnni")), r.output


def _claiming(bundle: Path, tmp: Path, weights: str, claim: str | None) -> Path:
    """A copy of the bundle whose int8 file has `weights` ('vnni': 8-bit, 'any': 7-bit)
    while its recipe claims `claim` (a file swapped in by hand, or re-quantised)."""
    out = tmp / f"b-{weights}-{claim}"
    shutil.copytree(bundle, out)
    _quantise(out / "model.onnx", out / "model.int8.onnx", "int8", weights)
    recipe = {"kind": "dynamic"} | ({} if claim is None else {"cpu": claim})
    load_manifest(out).with_precision(
        "int8", "model.int8.onnx", FileEntry.of(out / "model.int8.onnx", "model:int8"),
        {"recipe": recipe}).save(out)
    return out


@pytest.mark.parametrize("flags,machine,says", [
    (CPUS["amd-epyc-avx2"][1], "x86_64", "saturates them"),
    (None, "x86_64", "cannot tell"),
])
@pytest.mark.parametrize("weights,claim", [("vnni", "any"), ("any", "vnni"), ("any", None),
                                           ("vnni", "vnni"), ("any", "any")])
def test_runtime_warns_where_the_cpu_lacks_what_the_file_needs(
        tiny_bundle, tmp_path_factory, monkeypatch, flags, machine, says, weights, claim):
    """Where the CPU could saturate, the weights in the file decide, not the recipe that
    says how it was made: 8-bit weights warn whatever the recipe claims, 7-bit ones never;
    a bare file (no manifest) is read the same way."""
    _, result = tiny_bundle
    bundle = _claiming(result.path, tmp_path_factory.mktemp("claim"), weights, claim)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: None if flags is None
                        else frozenset(flags.split()))
    monkeypatch.setattr(platform, "machine", lambda: machine)
    for opened in ({"model": bundle, "precision": "int8"}, {"model": bundle / "model.int8.onnx"}):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with ViTSession(opened.pop("model"), **opened) as s:
                warned = s.cpu_warning
        texts = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)
                 and "int8" in str(w.message)]
        if weights == "vnni":
            assert warned and says in warned and len(texts) == 1, texts
        else:
            assert warned is None and not texts, texts
