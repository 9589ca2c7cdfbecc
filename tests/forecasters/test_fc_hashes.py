"""The file hashes written into run configs, likelihood lines and SFT set records (`eval.fingerprint.sha256_files`,
`sha256_tree`): values pinned to what the toolkit has always written, so resumed runs keep their config hash."""

from __future__ import annotations

from eval.environment import loaded_versions
from eval.fingerprint import sha256_files, sha256_tree
from forecasters.runner import adapter_hash


def _tree(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"abc")
    (tmp_path / "sub" / "b.txt").write_bytes(b"hello\n")
    return tmp_path


def test_file_hashes_are_the_values_written_before(tmp_path):
    d = _tree(tmp_path)
    assert adapter_hash(str(d)) == "03b8e4000e177765"  # names relative to the directory, sorted
    assert adapter_hash(str(d / "a.bin")) == "5be29d05a6c01c17"  # one file: its name and bytes
    assert adapter_hash(str(d / "missing")) is None and sha256_tree(d / "missing") is None
    assert sha256_files([d / "a.bin"])[:16] == "ba7816bf8f01cfea"  # bytes alone: sha256(b"abc")
    assert sha256_files([d / "sub" / "b.txt", d / "a.bin"], name=lambda f: f.name) == (
        "1a6433c4758d679155378e6e0b7730dd486d05364ce9f50577b0a4f8fd93a31a")


def test_loaded_versions_names_only_imported_modules():
    v = loaded_versions(("json", "surely_not_a_module_name"))
    assert set(v) == {"python", "json"} and v["json"] != ""
