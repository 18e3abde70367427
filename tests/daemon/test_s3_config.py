"""casfsd's [store] root as an s3:// URL, with the explicit endpoint option."""

from __future__ import annotations

from pathlib import Path

import pytest

from casfs.daemon import config as dconfig
from casfs.errors import ConfigError
from casfs.node.worker import config_from_json, config_to_json
from casfs.util.location import S3Location


def _write(tmp: Path, store: str) -> Path:
    p = tmp / "casfs.toml"
    p.write_text(f'[store]\n{store}\n[node]\nstate_dir = "{tmp}/state"\n'
                 '[[mounts]]\nname = "kern"\nnamespace = "kern-ns"\n')
    return p


def test_s3_root_with_endpoint(tmp_path: Path) -> None:
    cfg = dconfig.load(_write(tmp_path, 'root = "s3://casfs-cache/team/a"\n'
                                         'endpoint = "http://127.0.0.1:8333"'))
    assert cfg.root == S3Location("casfs-cache", "team/a", "http://127.0.0.1:8333")
    (m,) = cfg.mount_configs()
    assert m.root == cfg.root
    # the configuration a mount process gets (through a pipe) round-trips the location
    assert config_from_json(config_to_json(m)).root == cfg.root
    flags = dconfig.Overrides(root="s3://other-bucket/x?region=eu-west-1")
    assert dconfig.load(_write(tmp_path, ""), flags).root == \
        S3Location("other-bucket", "x", "", "eu-west-1")


@pytest.mark.parametrize(("store", "words"), [
    ('root = "s3://Bad_Bucket/x"', "bucket"),
    ('root = "s3://b-ok/x?secret=1"', "unknown option"),
    ('root = "s3://key:pw@b-ok/x"', "credentials"),
    ('root = "s3://b-ok/x"\nendpoint = "http://key:pw@h:1"', "credentials"),
    ('root = "s3://b-ok/x?endpoint=http://key:pw@h:1"', "credentials"),
    ('root = "/abs/root"\nendpoint = "http://h:1"', "only for an s3://"),
    ('root = "s3://b-ok/x"\nendpoint = "ftp://h"', "http://"),
    ('root = "gs://b-ok/x"', "scheme"),
])
def test_bad_s3_settings_are_one_clear_error(tmp_path: Path, store: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as e:
        dconfig.load(_write(tmp_path, store))
    assert "pw" not in str(e.value)  # never echoed
