"""The proxy's configuration: one precedence (flag, environment, file, default) for every
setting, one-line errors naming the key, ``--print-config`` that hides secrets and reads
back as the same configuration, and the docs' table generated from the settings."""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import __version__
from pd_policy_vllm.http.cli import configuration, main
from pd_policy_vllm.http.config import ConfigError, Kind, resolve, settings
from pd_policy_vllm.http.config.shown import TABLE_NAME, settings_table
from pd_policy_vllm.http.flags import GROUPS, parser
from pd_policy_vllm.http.reload import RELOADED

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ["--prefill", "http://p:1", "--decode", "http://d:1"]
SETTINGS = settings(parser())

#: A good value of every setting, as the environment writes it and as it reads.
TEXT: dict[str, tuple[str, Any]] = {
    "prefill": ("http://p:2", ["http://p:2"]),
    "decode": ("http://d:2", ["http://d:2"]),
    "encode": ("http://e:2", ["http://e:2"]),
    "mrope": ("true", True),
    "kv_mode": ("transfer", "transfer"),
    "bootstrap_port": ("8999", 8999),
    "decode_capability": ("lm-only+metadata", "lm-only+metadata"),
    "decode_kv_transfer_config": (
        '{"kv_connector": "NixlConnector"}',
        {"kv_connector": "NixlConnector"},
    ),
    "startup_timeout": ("5.5", 5.5),
    "dns_server": ("127.0.0.1:5353", "127.0.0.1:5353"),
    "host": ("::1", "::1"),
    "port": ("9001", 9001),
    "processes": ("3", 3),
    "pre_stop_seconds": ("0", 0.0),
    "drain_seconds": ("2.5", 2.5),
    "config_watch_seconds": ("0.5", 0.5),
    "log_format": ("json", "json"),
    "metrics_port": ("9100", 9100),
    "otlp_traces_endpoint": ("http://127.0.0.1:4317", "http://127.0.0.1:4317"),
    "otlp_traces_sample_ratio": ("0.25", 0.25),
    "access_log": ("false", False),
    "attempts": ("4", 4),
    "probe_interval": ("0.5", 0.5),
    "balance": ("round_robin", "round_robin"),
    "affinity_bound": ("1.5", 1.5),
    "kv_routing": ("yes", True),
    "kv_hash_seed": ("7", "7"),
    "kv_index_blocks": ("64", 64),
    "render_once": ("off", False),
    "remote_media": ("refuse", "refuse"),
    "allowed_media_domains": ("a.example,b.example", ["a.example", "b.example"]),
    "trust_client_uuids": ("1", True),
    "media_max_bytes": ("1024", 1024),
    "media_max_redirects": ("0", 0),
    "media_timeout": ("2.5", 2.5),
    "media_allow_private_hosts": ("on", True),
    "media_allow_network": ("10.0.0.0/8", [ipaddress.ip_network("10.0.0.0/8")]),
    "worker_api_key_file": ("/run/key", Path("/run/key")),
    "api_keys_file": ("/run/keys", Path("/run/keys")),
    "admin": ("true", True),
    "admin_api_key": ("k1,k2", ["k1", "k2"]),
    "admin_api_keys_file": ("/run/admin", Path("/run/admin")),
    "admin_allowed_hosts": ("10.0.0.0/8", ["10.0.0.0/8"]),
    "max_body_mib": ("8", 8.0),
    "max_media_items": ("3", 3),
    "max_content_parts": ("40", 40),
    "header_timeout": ("3", 3.0),
    "keepalive_timeout": ("9", 9.0),
    "max_client_connections": ("5", 5),
    "body_timeout": ("7", 7.0),
    "request_timeout": ("11", 11.0),
    "worker_read_timeout": ("12", 12.0),
    "max_response_mib": ("13", 13.0),
    "max_connections_per_worker": ("14", 14),
    "worker_queue_timeout": ("15", 15.0),
}


def _file_value(key: str) -> Any:
    # The same value as a TOML file writes it: native types, a table for a JSON object.
    value = TEXT[key][1]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [str(v) if not isinstance(v, str) else v for v in value]
    return value


def _flags(key: str) -> list[str]:
    setting = next(s for s in SETTINGS if s.key == key)
    text, value = TEXT[key]
    if setting.kind is Kind.BOOL:
        # The flag of the pair that sets this value.
        action = next(a for a in setting.actions if a.const == value)
        return [action.option_strings[0]]
    if setting.kind is Kind.LIST and setting.actions[0].nargs == "*":
        return [setting.flags[0], *text.split(",")]
    if setting.kind is Kind.LIST:
        return [flag for item in text.split(",") for flag in (setting.flags[0], item)]
    return [setting.flags[0], text]


def test_every_setting_has_a_value_here() -> None:
    # A new flag is a new setting: it gets a value here, so every layer is tried on it.
    assert sorted(TEXT) == sorted(s.key for s in SETTINGS)


def test_every_setting_is_in_a_group_of_help() -> None:
    assert {s.group for s in SETTINGS} <= set(GROUPS) and all(s.group for s in SETTINGS)
    assert all(s.help for s in SETTINGS)
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)  # one variable each


@pytest.mark.parametrize("key", sorted(TEXT))
def test_each_layer_alone_gives_the_value(key: str) -> None:
    setting = next(s for s in SETTINGS if s.key == key)
    want = TEXT[key][1]
    cli = parser()
    by_flag = resolve(cli, SETTINGS, _flags(key), {})
    by_env = resolve(cli, SETTINGS, [], {setting.env: TEXT[key][0]})
    by_file = resolve(cli, SETTINGS, [], {}, {key: _file_value(key)})
    for resolved, source in ((by_flag, "flag"), (by_env, "env"), (by_file, "file")):
        assert getattr(resolved.args, key) == want, source
        assert resolved.sources[key] == source
    default = resolve(cli, SETTINGS, [], {})
    assert getattr(default.args, key) == setting.default != want
    assert default.sources[key] == "default"


LAYERS = st.sampled_from(sorted(TEXT)).flatmap(
    lambda key: st.tuples(
        st.just(key), st.lists(st.sampled_from(["flag", "env", "file"]), unique=True)
    )
)


@given(LAYERS)
def test_the_highest_layer_given_wins(case: tuple[str, list[str]]) -> None:
    # Each layer holds another value (the default, the flag's or an unrelated setting's
    # value), so the one read names the layer it came from.
    key, layers = case
    setting = next(s for s in SETTINGS if s.key == key)
    argv = _flags(key) if "flag" in layers else []
    environ = {setting.env: TEXT[key][0]} if "env" in layers else {}
    file = {key: _file_value(key)} if "file" in layers else {}
    resolved = resolve(parser(), SETTINGS, argv, environ, file)
    want = next((layer for layer in ("flag", "env", "file") if layer in layers), "default")
    assert resolved.sources[key] == want
    # Below the winner: another value under the same key changes nothing.
    if want in ("flag", "env") and "file" in layers:
        assert getattr(resolved.args, key) == TEXT[key][1]


def test_a_flag_over_env_over_file_with_different_values() -> None:
    environ = {"PD_POLICY_PORT": "9002", "PD_POLICY_MAX_BODY_MIB": "2"}
    file = {"port": 9003, "max_body_mib": 3, "attempts": 5}
    args = resolve(parser(), SETTINGS, ["--port", "9001"], environ, file).args
    assert (args.port, args.max_body_mib, args.attempts, args.processes) == (9001, 2.0, 5, 1)


@pytest.mark.parametrize(
    ("environ", "file", "message"),
    [
        ({}, {"max_bdy_mib": 3}, "f: max_bdy_mib: no such setting (did you mean max_body_mib?)"),
        ({}, {"max_body_mib": -1}, "f: max_body_mib: must be positive, not -1"),
        ({}, {"max_body_mib": True}, "f: max_body_mib: true is not a max_body_mib value"),
        ({}, {"admin": "yes"}, 'f: admin: "yes" is not true or false'),
        ({}, {"balance": "fastest"}, "f: balance: 'fastest' is not one of"),
        ({}, {"port": [1]}, "f: port: [1] is not a port value"),
        ({"PD_POLICY_PORT": "x"}, {}, "$PD_POLICY_PORT: port: invalid literal"),
        ({"PD_POLICY_ADMIN": "maybe"}, {}, "$PD_POLICY_ADMIN: admin: 'maybe' is not true"),
        (
            {"PD_POLICY_MEDIA_ALLOW_NETWORK": "10.0.0.1/8"},
            {},
            "$PD_POLICY_MEDIA_ALLOW_NETWORK: media_allow_network: 10.0.0.1/8 has host bits set",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(
    environ: dict[str, str], file: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(parser(), SETTINGS, [], environ, file, "f")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    assert caught.value.param in {*file, *(s.key for s in SETTINGS if s.env in environ)}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    return path


WORKERS_FILE = """
[[workers]]
url = "http://p0:8000"
role = "prefill"
kv_transfer_config = { kv_connector = "NixlConnector", kv_role = "kv_producer" }
labels = { zone = "a" }

[[workers]]
url = "http://d0:8000"
role = "decode"
capability = "lm-only"
"""


def test_workers_come_from_the_file_alone(tmp_path: Path) -> None:
    path = _write(tmp_path, "port = 9004\n" + WORKERS_FILE)
    args, _ = configuration(["--config", str(path)], {})
    assert args.port == 9004 and args.prefill == [] and args.decode == []
    prefill, decode = args.workers
    assert (prefill.role, prefill.url, dict(prefill.labels)) == ("prefill", "http://p0:8000",
                                                                  {"zone": "a"})  # fmt: skip
    assert (decode.role, decode.capability) == ("decode", "lm-only")
    # $PD_POLICY_CONFIG names the file as --config does.
    env_args, _ = configuration([], {"PD_POLICY_CONFIG": str(path)})
    assert env_args.workers == args.workers


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[workers]]\nrole = "decode"\n', "workers[0]: url: a worker needs its URL"),
        ('[[workers]]\nurl = "http://d"\nrole = "dec"\n', "worker http://d: role: 'dec' is not"),
        (
            '[[workers]]\nurl = "http://d"\nrole = "decode"\nvision = true\n',
            "workers[0]: vision: no such key of a worker",
        ),
        (
            '[[workers]]\nurl = "http://d"\nrole = "decode"\ncapability = "all"\n',
            "worker http://d: capability: 'all' is not one of",
        ),
        (
            '[[workers]]\nurl = "http://d"\nrole = "decode"\nblock_size = 0\n',
            "worker http://d: block_size: 0 is not positive",
        ),
        (
            '[[workers]]\nurl = "http://d"\nrole = "decode"\n' * 2,
            "worker http://d: role: decode given twice",
        ),
        (
            '[[workers]]\nurl = "http://e"\nrole = "encode"\n'
            'ec_transfer_config = { ec_role = "producer" }\n',
            "worker http://e: ec_transfer_config: its ec_role is one of ec_producer",
        ),
        ("workers = 3\n", "workers: an array of tables"),
        ("port = \n", "not TOML: "),
        ("", "no prefill worker: --prefill URL, $PD_POLICY_PREFILL or a [[workers]] table"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        configuration(["--config", str(path)], {})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot be read"):
        configuration(["--config", str(tmp_path / "nope.toml")], {})


def test_print_config_hides_every_secret_and_reads_back_the_same(tmp_path: Path) -> None:
    secret = "sk-admin-7f3a"
    path = _write(tmp_path, f'admin_api_key = ["{secret}"]\nmax_body_mib = 3\n' + WORKERS_FILE)
    environ = {"PD_POLICY_KEEPALIVE_TIMEOUT": "31"}
    argv = ["--config", str(path), "--port", "9005", "--no-mrope", *WORKERS]
    args, shown = configuration(argv, environ)
    assert secret not in shown and "admin_api_key: 1 hidden (file)" in shown
    assert "port = 9005  # flag" in shown and "keepalive_timeout = 31.0  # env" in shown
    # The output is a configuration file: read back alone, it gives the same settings
    # (but the secret, which it never shows) and the same workers.
    again, _ = configuration(["--config", str(_write(tmp_path, shown))], {})
    for setting in SETTINGS:
        if not setting.secret:
            assert getattr(again, setting.key) == getattr(args, setting.key), setting.key
    assert again.workers == args.workers
    assert tomllib.loads(shown)["port"] == 9005


def test_print_config_and_version_exit_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--print-config", *WORKERS, "--admin-api-key", "sk-flag-99"]) == 0
    out = capsys.readouterr().out
    assert "sk-flag-99" not in out and "admin_api_key: 1 hidden (flag)" in out
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip().endswith(__version__)


def test_a_bad_configuration_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, "max_body_mb = 1\n")
    assert main(["--config", str(path), *WORKERS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_body_mb: no such setting" in err


def test_the_docs_table_is_the_settings() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    block = re.search(
        rf"<!-- BEGIN GENERATED: {TABLE_NAME} -->\n(.*?)\n<!-- END GENERATED: {TABLE_NAME} -->",
        text,
        re.S,
    )
    assert block is not None
    assert block.group(1).strip() == settings_table(SETTINGS, RELOADED).strip()
