"""`serve --write-config` (and `serve --ray`) refuse what could never deploy before writing
anything: an unknown provider, a NaFlex bundle (Ray Serve's replicas take NCHW images), each
named in one line, exit 2 (they wrote a config that failed at `serve deploy`, or 'failed to
deploy' with no reason)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from vit_deploy.cli import main
from siglip2_tiny import tiny_siglip2
from vit_deploy.export.bundle import ExportOptions, export_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, make_tiny):
    out = tmp_path_factory.mktemp("serve") / "b"
    export_bundle(make_tiny(), out, options=ExportOptions(resolution=(32, 32), simplify=False))
    return out


@pytest.mark.parametrize("provider", ["tpu", "cpu,tpu", "cuda,npu0"])
def test_an_unknown_provider_is_refused_before_a_config_is_written(bundle, tmp_path, provider):
    out = tmp_path / "serve.yaml"
    r = CliRunner().invoke(main, ["serve", str(bundle), "--write-config", str(out),
                                  "--provider", provider])
    assert r.exit_code == 2 and "unknown provider" in r.output, r.output
    assert not out.exists()


def test_known_providers_write_a_config(bundle, tmp_path):
    out = tmp_path / "serve.yaml"
    r = CliRunner().invoke(main, ["serve", str(bundle), "--write-config", str(out),
                                  "--provider", "cuda,cpu", "--quiet"])
    assert r.exit_code == 0 and out.is_file(), r.output


def test_a_naflex_bundle_is_refused_by_name(tmp_path):
    src = tiny_siglip2(tmp_path / "siglip2")[1]
    naflex = tmp_path / "naflex"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(src), "--naflex", "--max-patches",
                                  "16", "--out", str(naflex), "--quiet"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "serve.yaml"
    r = CliRunner().invoke(main, ["serve", str(naflex), "--write-config", str(out)])
    assert r.exit_code == 2 and "NaFlex" in r.output and "Ray Serve" in r.output, r.output
    assert not out.exists()
