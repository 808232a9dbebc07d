"""The admission example of py/README.md, run as written against a real
kvbrokerd on the seed pool."""

import pathlib
import re

from conftest import MiB


def readme_block(index):
    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)[index]


def test_admission_example(daemon, pool_name):
    example = {}
    exec(compile(readme_block(1), "README.md", "exec"), example)
    admit, release = example["admit"], example["release"]
    with daemon.client() as kvb:
        kvb.create_pool(pool_name, page_size=14 * MiB, block_bytes=6 * MiB,
                        max_blocks=5)
        assert admit(kvb, pool_name, "req-1", 2) == [0, 1]
        assert admit(kvb, pool_name, "req-2", 2) is None  # 1 block left
        try:
            admit(kvb, pool_name, "req-3", 4)
            raise AssertionError("4 blocks never fit")
        except ValueError:
            pass
        assert admit(kvb, pool_name, "req-4", 1) == [3]
        release(kvb, pool_name, "req-1", [0, 1])
        assert kvb.capacity(pool_name).available_blocks == 2
