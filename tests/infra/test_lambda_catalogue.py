"""The Lambda code assets carry the model catalogue the API validates inputs from."""

from __future__ import annotations

from pathlib import Path

from asyncinfer.models.catalogue import load_catalogue
from infra.lambda_code import stage_catalogue, stage_lambda_code

REPO = Path(__file__).resolve().parents[2]


def test_api_asset_holds_the_default_catalogue_and_yaml() -> None:
    out = Path(stage_lambda_code("api"))
    packaged = out / "asyncinfer" / "models" / "models.yaml"
    assert packaged.is_file() and not packaged.is_symlink()
    assert packaged.read_text() == (REPO / "models.yaml").read_text()
    assert (out / "yaml" / "__init__.py").is_file()
    assert not list((out / "yaml").glob("*.so"))  # built for this machine, not for Lambda's


def test_a_custom_catalogue_is_staged_with_its_input_schemas(tmp_path: Path) -> None:
    rel = stage_catalogue(REPO / "tests" / "custom_model" / "models.yaml", tmp_path)
    assert rel == "catalogue/models.yaml"
    staged = load_catalogue(tmp_path / rel)  # its schema files came along
    assert staged.input_schemas["wordcount"]["required"] == ["text"]
    assert not (tmp_path / "catalogue" / "weights").exists()
