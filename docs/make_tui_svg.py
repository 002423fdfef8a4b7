"""Make docs/tui.svg and docs/tui-compare.svg, the README's screenshots of ``apr tui``:
the Whisper-shaped demo model of the README (a LayerNorm weight with mean 11) in the
histogram view, and compared with a copy whose LayerNorm is fixed.  Run from the
repository root: ``PYTHONPATH=. python docs/make_tui_svg.py`` (needs ``aprfast[tui]``)."""

import asyncio
import os
import tempfile

import numpy as np

import aprfast
from aprfast.numerics.quantization import quantize
from aprfast.tui import ModelApp

HERE = os.path.dirname(os.path.abspath(__file__))


def demo_tensors(rng, layer_norm_mean):
    return {"decoder.layer_norm.weight": (layer_norm_mean + 0.19 * rng.standard_normal(384)).astype(np.float32),
            "decoder.layers.0.fc1.weight": quantize((0.03 * rng.standard_normal((1536, 384))).astype(np.float32),
                                                    "q8_0"),
            "decoder.token_embedding.weight": (0.03 * rng.standard_normal((1000, 384))).astype(np.float16),
            "encoder.conv1.weight": (0.04 * rng.standard_normal((384, 80, 3))).astype(np.float32),
            "encoder.layer_norm.bias": (0.01 * rng.standard_normal(384)).astype(np.float32),
            "encoder.layer_norm.weight": (1.2 + 0.09 * rng.standard_normal(384)).astype(np.float32)}


async def shoot(app, keys, name):
    async with app.run_test(size=(130, 34)) as pilot:
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await pilot.pause()
        app.save_screenshot(name, HERE)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # the title shows the file names as given
        try:
            aprfast.save_file(demo_tensors(np.random.default_rng(1), 11.1), "whisper-demo.apr",
                              metadata={"name": "whisper-demo", "license": "MIT"})
            aprfast.save_file(demo_tensors(np.random.default_rng(1), 1.05), "whisper-fixed.apr",
                              metadata={"name": "whisper-demo", "license": "MIT"})
            for paths, keys, name in ((("whisper-demo.apr",), ["h"], "tui.svg"),
                                      (("whisper-demo.apr", "whisper-fixed.apr"), ["c"], "tui-compare.svg")):
                app = ModelApp(*paths)
                try:
                    asyncio.run(shoot(app, keys, name))
                finally:
                    app.close()
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    main()
