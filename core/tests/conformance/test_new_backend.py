"""``edgeport new-backend``: names, the template shipped in the core, ``plugins/template`` kept identical to it,
and a generated package that installs, is discovered, passes the conformance suite and runs a lowered model --
in a directory outside the repository, as a vendor would do it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from edgeport import cli, scaffold

REPO = Path(__file__).resolve().parents[3]
CORE = REPO / "core"


# -- names ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, dist, package, backend_id, ident",
    [
        ("acmenpu", "edgeport-acmenpu", "edgeport_acmenpu", "AcmenpuBackend", "acmenpu"),
        ("acme-npu", "edgeport-acme-npu", "edgeport_acme_npu", "AcmeNpuBackend", "acme_npu"),
        ("acme_npu2", "edgeport-acme-npu2", "edgeport_acme_npu2", "AcmeNpu2Backend", "acme_npu2"),
        ("template", "edgeport-template", "edgeport_template", "TemplateBackend", "template"),
    ],
)
def test_names(name, dist, package, backend_id, ident):
    names = scaffold.backend_names(name)
    assert (names.distribution, names.package, names.backend_id, names.ident) == (dist, package, backend_id, ident)


def test_explicit_backend_id():
    names = scaffold.backend_names("acmenpu", "AcmeNPUBackend")
    assert names.backend_id == "AcmeNPUBackend" and names.prefix == "AcmeNPU"


@pytest.mark.parametrize("bad", ["", "Acme", "1npu", "acme npu", "acme--npu", "acme-", "class", "ü"])
def test_bad_names_are_refused(bad):
    with pytest.raises(scaffold.ScaffoldError):
        scaffold.backend_names(bad)


# -- the template --------------------------------------------------------------------------------------------


def test_plugins_template_is_the_shipped_template_rendered():
    """plugins/template must equal edgeport/templates/backend rendered for 'template' (no drift either way).

    To change the template, edit core/src/edgeport/templates/backend/ and run
    ``edgeport new-backend template --dir plugins/template --force``.
    """
    problems = scaffold.compare_with_template(REPO / "plugins" / "template", scaffold.TEMPLATE_NAMES)
    assert not problems, "plugins/template drifted from core/src/edgeport/templates/backend:\n" + "\n".join(problems)


def test_rendering_replaces_every_template_name(tmp_path):
    files = scaffold.render_template(scaffold.backend_names("acme-npu"))
    assert "src/edgeport_acme_npu/plugin.py" in files and "src/edgeport_acme_npu/schema/README.md" in files
    leftovers = {
        rel: token
        for rel, data in files.items()
        for token in ("edgeport_template", "edgeport-template", "TemplateBackend", "TemplatePartitioner",
                      "TemplateExecutor", "TemplateCompileOptions", 'template = "')
        if token in data.decode()
    }
    assert not leftovers
    pyproject = files["pyproject.toml"].decode()
    assert 'name = "edgeport-acme-npu"' in pyproject
    assert 'acme_npu = "edgeport_acme_npu.plugin"' in pyproject
    assert 'backend_id = "AcmeNpuBackend"' in files["tests/test_conformance.py"].decode()


def test_cli_creates_and_refuses_to_overwrite(tmp_path, capsys):
    dest = tmp_path / "pkg"
    assert cli.main(["new-backend", "acmenpu", "--dir", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "AcmenpuBackend" in out and f"pip install -e {dest}" in out
    assert (dest / "src" / "edgeport_acmenpu" / "plugin.py").is_file()
    assert cli.main(["new-backend", "acmenpu", "--dir", str(dest)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert cli.main(["new-backend", "Bad Name", "--dir", str(tmp_path / "x")]) == 2
    assert cli.main(["new-backend", "acmenpu", "--dir", str(dest), "--force"]) == 0


def _require_offline_builds() -> None:
    """Skip unless this environment can build wheels without downloading anything (setuptools >= 70.1 has
    bdist_wheel built in; older ones need the 'wheel' package)."""
    import importlib.util

    import setuptools

    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    if version < (70, 1) and importlib.util.find_spec("wheel") is None:
        pytest.skip(f"setuptools {setuptools.__version__} without 'wheel' cannot build wheels offline; "
                    "pip install 'setuptools>=70.1'")


def _declares_template_package_data() -> bool:
    return "templates/" in (CORE / "pyproject.toml").read_text()


@pytest.mark.xfail(not _declares_template_package_data(), strict=True,
                   reason="core/pyproject.toml [tool.setuptools.package-data] must list 'templates/**/*' "
                          "so the wheel ships the backend template (requested from its owner)")
def test_the_core_wheel_ships_the_template(tmp_path):
    _require_offline_builds()
    src = tmp_path / "core"
    junk = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")

    def ignore(directory: str, names: list[str]) -> set[str]:
        return set(junk(directory, names)) | ({"tests"} if Path(directory) == CORE else set())

    shutil.copytree(CORE, src, ignore=ignore)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import zipfile

    (wheel,) = (tmp_path / "dist").glob("edgeport-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in scaffold.template_files():
        assert f"edgeport/templates/backend/{rel}" in names
    assert "edgeport/testing/conformance/suite.py" in names


# -- a generated package, end to end -------------------------------------------------------------------------


def _run(cmd, *, env, cwd, timeout=600):
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EDGEPORT_", "PYTEST_"))}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


LOWER_AND_RUN = textwrap.dedent(
    """
    import numpy as np, torch, edgeport
    from edgeport.runtime import Runtime
    from edgeport_acmenpu import AcmenpuPartitioner

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5), torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    program = edgeport.to_edge_transform_and_lower(torch.export.export(model, (x,)),
                                                   partitioner=[AcmenpuPartitioner()]).to_executorch()
    method = Runtime.get().load_program(program.buffer).load_method()
    assert method.metadata.backends == ("AcmenpuBackend",), method.metadata.backends
    (out,) = method.execute([x.numpy()])
    np.testing.assert_allclose(out, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    print("lowered model ran on AcmenpuBackend")
    """
)


def _fake_install(site: Path, pkg: Path, names: scaffold.BackendNames) -> None:
    """What ``pip install`` leaves behind, minimally: a dist-info with the entry point (found on sys.path)."""
    info = site / f"{names.package}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {names.distribution}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[edgeport.backends]\n{names.ident} = {names.package}.plugin\n")


def test_generated_backend_is_discovered_and_passes_the_suite(tmp_path):
    """The fast variant: generate, make it importable and discoverable through PYTHONPATH (a dist-info with
    its entry point), then ``edgeport backends`` and the package's own tests: its conformance suite without the
    model-zoo cases (the slow variant runs them) and its test that a model lowered with its partitioner runs on
    edgeport's runtime."""
    pkg = tmp_path / "edgeport-acmenpu"
    names = scaffold.new_backend("acmenpu", pkg)
    _fake_install(tmp_path / "site", pkg, names)
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(pkg / "src")]))

    code, out = _run([sys.executable, "-m", "edgeport.cli", "backends"], env=env, cwd=tmp_path)
    assert code == 0, out
    assert "AcmenpuBackend  version 0.1.0  distribution edgeport-acmenpu  plugin acmenpu  ops 4  available" in out

    code, out = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not model-"],
                     env=env, cwd=pkg)
    assert code == 0, out
    assert re.search(r"\d+ passed", out) and "failed" not in out and " error" not in out
    # tests/test_backend.py (run above) lowers a model with the partitioner and runs it on edgeport's runtime
    assert "test_model_lowered_with_the_partitioner_runs_on_edgeport_runtime" not in out  # (it passed quietly)


def _parent_site_packages() -> str:
    return sysconfig.get_paths()["purelib"]


@pytest.mark.slow
def test_vendor_flow_in_a_fresh_venv(tmp_path):
    """The acceptance flow: a fresh venv outside the repository (it sees this environment's packages through a
    .pth file, so nothing is downloaded), ``edgeport new-backend``, ``pip install -e``, ``edgeport backends``,
    the package's whole test suite (conformance suite with the model zoo), and a lowered model."""
    _require_offline_builds()
    venv = tmp_path / "venv"
    code, out = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=_env(), cwd=tmp_path)
    assert code == 0, out
    py = venv / "bin" / "python"
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    (site / "_edgeport_parent.pth").write_text(f"import site; site.addsitedir({_parent_site_packages()!r})\n")
    env = _env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")

    pkg = tmp_path / "work" / "acmenpu"
    code, out = _run([py, "-m", "edgeport.cli", "new-backend", "acmenpu", "--dir", str(pkg)], env=env, cwd=tmp_path)
    assert code == 0, out
    code, out = _run([py, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "-e", str(pkg)],
                     env=env, cwd=tmp_path)
    assert code == 0, out
    assert list(site.glob("edgeport_acmenpu-*.dist-info")), "pip did not install into the new venv"

    code, out = _run([py, "-m", "edgeport.cli", "backends"], env=env, cwd=tmp_path)
    assert code == 0, out
    assert "AcmenpuBackend" in out and "plugin acmenpu" in out and "distribution edgeport-acmenpu" in out

    code, out = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider"], env=env, cwd=pkg)
    assert code == 0, out
    assert "model-transformer_encoder_layer" not in out and " passed" in out

    code, out = _run([py, "-c", LOWER_AND_RUN], env=env, cwd=tmp_path)
    assert code == 0 and "ran on AcmenpuBackend" in out, out
