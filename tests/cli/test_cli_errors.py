"""Every CLI path maps errors to a message and an exit code: 2 for bad input, 1 for a failed
check; huge integers, contradictory flags, a bare .onnx file, sizes over the memory guard."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from vit_deploy.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("args,message", [
    (["export", "--model", "tiny", "--seed", str(10**20)], "--seed"),
    (["export", "--model", "tiny", "--num-classes", str(10**30)], "--num-classes"),
    (["export", "--model", "tiny", "--res", "9" * 5000], "resolution"),
    (["export", "--model", "tiny", "--res", "99999"], "at most 16384"),
    (["export", "--model", "B/16", "--patch", "8"], "--model B/16 says patch 16 and --patch says 8"),
    (["export", "--model", "tiny", "--out", "."], "current directory"),
    (["bench", "{bundle}", "--batch", str(10**8)], "batch sizes must be positive integers up to"),
    (["bench", "{bundle}", "--threads", "2000"], "threads must be positive integers up to 256"),
    (["bench", "{bundle}", "--runs", str(10**20)], "--runs"),
    (["bench", "{bundle}", "--res", "8192", "--batch", "4096"], "GiB"),
    (["check", "{bundle}", "--res", "16384x16384", "--batch", "64"], "GiB"),
    (["predict", "{bundle}", "{image}", "--threads", "2000"], "--threads"),
    (["predict", "{bundle}", "{image}", "--top-k", str(10**20)], "--top-k"),
    (["predict", "{onnx}", "{image}"], "bare .onnx file without a manifest"),
    (["triton", "{bundle}", "--out", "{tmp}/r", "--max-batch", str(10**9)], "--max-batch"),
    (["triton", "{bundle}", "--out", "{tmp}/r", "--name", "../up"], "model name"),
    (["serve", "{bundle}", "--port", "70000"], "--port"),
    (["info", "{tmp}"], "manifest.json"),
    # issue 24: numbers that become arithmetic, guards before allocation, patch 0
    (["predict", "{onnx}", "{image}", "--res", "32", "--mean", "0.5,0.5,0.5", "--std", "0,0,0"],
     "std must be 3 finite numbers from 1e-06 to 10000, got [0.0, 0.0, 0.0]"),
    (["predict", "{onnx}", "{image}", "--res", "32", "--mean", "nan,0.5,0.5", "--std",
      "0.5,0.5,0.5"], "mean must be finite numbers from -10000 to 10000, got [nan,"),
    (["predict", "{bundle}", "{image}", "--std", "1e-300,1,1"], "std must be 3 finite numbers"),
    (["predict", "{bundle}", "{image}", "--res", "8192"], "GiB"),
    (["sweep", "{weights}", "--patch", "0"], "patch sizes must be positive integers up to 1024"),
])
def test_bad_input_exits_2_with_a_message(tiny_bundle, tmp_path, args, message):
    _, result = tiny_bundle
    image = tmp_path / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    fill = {"{bundle}": str(result.path), "{image}": str(image), "{tmp}": str(tmp_path),
            "{onnx}": str(result.path / "model.onnx"),
            "{weights}": str(result.path / "weights.safetensors")}
    args = [fill.get(a, a.replace("{tmp}", str(tmp_path))) for a in args]
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "r").exists()


def test_a_bare_onnx_file_runs_with_mean_std_and_resolution(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    image = tmp_path / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    r = run("predict", result.path / "model.onnx", image, "--res", "32", "--mean", "0.5,0.5,0.5",
            "--std", "0.5,0.5,0.5", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["providers"][0] == "cpu" and out["predictions"][0]["input_size"] == [32, 32]


def test_json_output_is_strict_json_even_when_a_number_is_nan(tiny_bundle, tmp_path,
                                                               monkeypatch):
    """A comparison that produced NaN (a broken provider) is written as null, not NaN."""
    import vit_deploy.parity as parity

    _, result = tiny_bundle
    real = parity.judge
    monkeypatch.setattr(parity, "judge", lambda ref, out, **kw: real(ref, out * np.nan, **kw))
    report = tmp_path / "check.json"
    r = run("check", result.path, "--batch", "1", "--json", report, "--quiet")
    assert r.exit_code == 1, r.output
    data = json.loads(report.read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["passed"] is False and data["cases"][0]["max_abs"] is None


# -- one base class: the exit code is the error class's, not a list of names in the CLI ----
def _error_classes():
    from vit_deploy.atomic import ClobberError
    from vit_deploy.bench.report import ReportError
    from vit_deploy.export.checkpoints import CheckpointError
    from vit_deploy.export.onnx import ExportError
    from vit_deploy.parity import ParityError
    from vit_deploy.precisions.quantize import QuantizeError
    from vit_deploy.reports.save import MissingExtraError
    from vit_deploy.runtime.manifest_parts import BundleError
    from vit_deploy.runtime.preprocess import ImageError
    from vit_deploy.runtime.providers import ProviderError
    from vit_deploy.runtime.results import OutputError
    from vit_deploy.runtime.session import InputError
    from vit_deploy.runtime.sizes import MemoryEstimateError
    from vit_deploy.runtime.swap import BusyError, OutputExistsError

    return {  # class: (exit code, the built-in class it still is)
        BundleError: (2, ValueError), ImageError: (2, ValueError), InputError: (2, ValueError),
        OutputError: (2, ValueError), MemoryEstimateError: (2, ValueError),
        CheckpointError: (2, ValueError), ReportError: (2, ValueError),
        OutputExistsError: (2, FileExistsError), ClobberError: (2, FileExistsError),
        MissingExtraError: (2, ImportError), ProviderError: (1, RuntimeError),
        BusyError: (1, RuntimeError), QuantizeError: (1, RuntimeError),
        ExportError: (1, RuntimeError), ParityError: (1, RuntimeError),
    }


def test_every_error_of_ours_derives_from_one_base_with_its_exit_code():
    from vit_deploy.runtime.errors import VitDeployError

    for cls, (code, builtin) in _error_classes().items():
        assert issubclass(cls, VitDeployError) and issubclass(cls, builtin), cls
        assert cls.exit_code == code, cls


@pytest.mark.parametrize("code", [1, 2, 3])
def test_the_cli_exits_with_the_errors_exit_code(monkeypatch, code):
    """A new error class needs no change in the CLI: its exit_code is what the CLI uses."""
    import vit_deploy.runtime.providers as providers
    from vit_deploy.runtime.errors import VitDeployError

    class NewError(VitDeployError, RuntimeError):
        exit_code = code

    def probe_all():
        raise NewError("the probe broke\nsecond line")

    monkeypatch.setattr(providers, "probe_all", probe_all)
    r = run("providers")
    assert r.exit_code == code and r.output.strip() == "Error: the probe broke", r.output


def test_cli_error_mapping_names_no_classes():
    """cli/group.py maps errors by `exit_code`, not by matching class names as strings."""
    from pathlib import Path

    import vit_deploy.cli.group as group

    source = Path(group.__file__).read_text()
    for cls in _error_classes():
        assert cls.__name__ not in source, cls.__name__


def _foreign(src: Path, dst: Path) -> Path:
    """`src` as another tool would have written it: the same graph, no vit-deploy metadata."""
    import onnx

    model = onnx.load(str(src))
    del model.metadata_props[:]
    onnx.save(model, str(dst))
    return dst


@pytest.mark.parametrize("flags,message", [
    ([], "resolution (--res), mean (--mean), std (--std), patch_size (--patch"),
    (["--res", "32", "--mean", "0.5", "--std", "0.5"], "pass patch_size (--patch: this file does"),
    (["--res", "32", "--patch", "8"], "pass mean (--mean), std (--std)"),
])
def test_a_foreign_onnx_file_names_the_flags_it_needs(tiny_bundle, tmp_path, flags, message):
    """A bare .onnx file without our metadata: every missing field is named with its flag,
    and the flags given are enough."""
    _, result = tiny_bundle
    onnx_file = _foreign(result.path / "model.onnx", tmp_path / "foreign.onnx")
    image = tmp_path / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    r = run("predict", onnx_file, image, *flags)
    assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    r = run("predict", onnx_file, image, "--res", "32", "--mean", "0.5,0.5,0.5", "--std",
            "0.5,0.5,0.5", "--patch", "8", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["predictions"][0]["input_size"] == [32, 32]


def test_a_patch_that_contradicts_the_model_is_refused(tiny_bundle, tmp_path):
    _, result = tiny_bundle
    image = tmp_path / "cat.png"
    Image.fromarray(np.full((40, 50, 3), 128, np.uint8)).save(image)
    for path in (result.path, result.path / "model.onnx"):
        r = run("predict", path, image, "--res", "32", "--mean", "0.5", "--std", "0.5",
                "--patch", "16")
        assert r.exit_code == 2 and "has patch size 8, not 16" in r.output, r.output
