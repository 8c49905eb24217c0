"""The training tests' shared fixture: curated shards of the scikit-image photos."""
import pytest

from training_fixtures import skimage_samples, write_curated_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    write_curated_shards(folder, skimage_samples(), per_shard=5)
    return folder
