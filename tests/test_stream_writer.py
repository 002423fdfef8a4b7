"""Writer(target, plan=[(name, dtype, shape), ...]): header and index first, each tensor
straight to the target as it is added, no spool, footer at close.

Bytes identical to save_file when declared in name order; a reader at the other end of
a real pipe gets each tensor before the next is added; mismatches are refused before
anything is written; a missing tensor or an exception leaves no file at a path; and
``python -c "...Writer(sys.stdout.buffer, plan=...)..." | apr inspect -`` works.
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from ml_dtypes import bfloat16

import aprfast
from aprfast import AprError, CorruptError, LayoutError, RawTensor
from aprfast.files import writer as writer_module
from aprfast.io import atomic

MiB = 1 << 20
LAYOUTS = ["aprender", "apr2"]


def sample(layout: str) -> dict:
    rng = np.random.default_rng(3)
    return {
        "a.weight": rng.standard_normal((8, 32)).astype(np.float32),
        "a.bias": rng.standard_normal(32).astype(bfloat16),
        "b.empty": np.zeros((3, 0), np.int32),
        "c.q": aprfast.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                                "APR_Q8" if layout == "aprender" else "Q4_0"),
        "d.step": np.array(11, np.int64),
        "e.big": rng.standard_normal(300_000).astype(np.float16),  # above the gather limit
    }


def declared(tensors, order=None):
    order = sorted(tensors) if order is None else order
    return [(n, _dtype(tensors[n]), tensors[n].shape) for n in order]


def _dtype(tensor):
    return tensor.dtype.name if isinstance(tensor, RawTensor) else tensor.dtype


def write_planned(target, tensors, metadata=None, order=None, **kw):
    order = sorted(tensors) if order is None else order
    with aprfast.Writer(target, metadata, plan=declared(tensors, order), **kw) as w:
        for name in order:
            w.add(name, tensors[name])


@pytest.fixture
def no_spool(monkeypatch):
    """Any attempt to create a spool file fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a planned Writer must not create a spool file")

    monkeypatch.setattr(writer_module, "open_anonymous", refuse)


# --- the bytes ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS + ["auto"])
def test_bytes_are_identical_to_save_file(layout, tmp_path, no_spool):
    tensors = sample("apr2" if layout == "apr2" else "aprender")
    meta = {"name": "planned", "description": "ok"}
    want = aprfast.save(tensors, meta, layout=layout)
    out = io.BytesIO()
    write_planned(out, tensors, meta, layout=layout)
    assert out.getvalue() == want
    path = tmp_path / "m.apr"
    write_planned(path, tensors, meta, layout=layout)
    assert path.read_bytes() == want
    write_planned(tmp_path / "fast.apr", tensors, meta, layout=layout, durable=False)
    assert (tmp_path / "fast.apr").read_bytes() == want


def test_apr2_with_32_byte_alignment_is_identical_too(no_spool):
    tensors = {"x": np.arange(5, dtype=np.int16), "y": np.ones((3, 3), np.bool_)}
    out = io.BytesIO()
    write_planned(out, tensors, layout="apr2", alignment=32)
    assert out.getvalue() == aprfast.save(tensors, layout="apr2", alignment=32)


def test_dtypes_may_be_numpy_dtypes_or_aprfast_names(no_spool):
    tensors = {"f": np.ones(4, np.float32), "h": np.ones(2, np.float16), "i": np.ones(3, np.int8),
               "q": aprfast.quantize(np.ones(32, np.float32), "Q8_0")}
    plan = [("f", "F32", (4,)), ("h", np.float16, [2]), ("i", "int8", (3,)), ("q", "q8_0", (32,))]
    out = io.BytesIO()
    with aprfast.Writer(out, plan=plan, layout="apr2") as w:
        for name, *_ in plan:
            w.add(name, tensors[name])
    assert out.getvalue() == aprfast.save(tensors, layout="apr2")


def test_an_undeclared_order_puts_the_data_in_that_order_and_both_readers_agree(no_spool):
    tensors = sample("aprender")
    order = ["e.big", "d.step", "b.empty", "a.weight", "c.q", "a.bias"]
    out = io.BytesIO()
    write_planned(out, tensors, order=order, layout="aprender")
    data = out.getvalue()
    with aprfast.open(data, verify=True) as f:
        assert f.keys() == sorted(tensors)  # the index is sorted by name as always
        offsets = [f.info(n).offset for n in order if n != "b.empty"]
        assert offsets == sorted(offsets)
        for name, value in tensors.items():
            got = f.get_tensor(name)
            assert (got.data.tobytes() if isinstance(got, RawTensor) else got.tobytes()) == (
                value.data.tobytes() if isinstance(value, RawTensor) else value.tobytes())
    assert len(data) == len(aprfast.save(tensors, layout="aprender"))


# --- streaming: nothing waits for close ---------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_reader_on_a_real_pipe_gets_each_tensor_before_the_next_is_added(layout, no_spool):
    tensors = {f"t{i}": np.full(1000 + i, i, np.float32) for i in range(5)}
    received = {name: threading.Event() for name in tensors}
    got, errors = {}, []
    r, w = os.pipe()

    def read():
        try:
            with os.fdopen(r, "rb") as pipe:
                for name, value in aprfast.stream(pipe):
                    got[name] = value
                    received[name].set()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            for event in received.values():
                event.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with os.fdopen(w, "wb") as pipe:
        with aprfast.Writer(pipe, {"name": "live"}, plan=declared(tensors), layout=layout) as writer:
            for name in sorted(tensors):
                writer.add(name, tensors[name])
                # The reader has this tensor while the writer is still open: no spool, no wait.
                assert received[name].wait(20), f"{name} did not reach the reader before close"
                assert not errors, errors
    reader.join(20)
    assert not errors, errors
    assert {n: v.tolist() for n, v in got.items()} == {n: v.tolist() for n, v in tensors.items()}


# --- refusals ------------------------------------------------------------------------------
def test_mismatches_are_refused_before_anything_is_written_and_the_writer_goes_on(tmp_path, no_spool):
    tensors = {"a": np.ones((2, 3), np.float32), "b": np.arange(4, dtype=np.int64)}
    path = tmp_path / "m.apr"
    with aprfast.Writer(path, plan=declared(tensors)) as w:
        with pytest.raises(LayoutError, match="not in the plan"):
            w.add("zzz", tensors["a"])
        with pytest.raises(LayoutError, match="out of order: the plan declares 'a' next"):
            w.add("b", tensors["b"])
        with pytest.raises(LayoutError, match="is F64, but the plan declares F32"):
            w.add("a", tensors["a"].astype(np.float64))
        with pytest.raises(LayoutError, match=r"has shape \[3, 2\], but the plan declares \[2, 3\]"):
            w.add("a", tensors["a"].reshape(3, 2))
        w.add("a", tensors["a"])
        with pytest.raises(LayoutError, match="already added"):
            w.add("a", tensors["a"])
        w.add("b", tensors["b"])
    assert path.read_bytes() == aprfast.save(tensors)


@pytest.mark.parametrize("plan, error, words", [
    ([("a", "F32")], LayoutError, "(name, dtype, shape)"),
    ([("a", "F32", (2,)), ("a", "F32", (2,))], LayoutError, "declared twice"),
    ([(1, "F32", (2,))], LayoutError, "names must be str"),
    ([("a", "F32", (-1,))], LayoutError, "non-negative"),
    ([("a", "F32", (2.0,))], LayoutError, "non-negative ints"),
    ([("a", "not-a-dtype", (2,))], LayoutError, "neither an aprfast dtype name nor a NumPy dtype"),
    ([("a", np.dtype("datetime64[s]"), (2,))], LayoutError, "cannot be stored"),
    ("a", TypeError, "list of (name, dtype, shape)"),
])
def test_bad_plans_are_refused_at_once(plan, error, words, tmp_path):
    with pytest.raises(error) as info:
        aprfast.Writer(tmp_path / "m.apr", plan=plan)
    assert words in str(info.value)
    assert os.listdir(tmp_path) == []


def test_a_plan_the_layout_cannot_hold_is_refused_and_auto_falls_back(tmp_path, no_spool):
    with pytest.raises(LayoutError):
        aprfast.Writer(tmp_path / "m.apr", plan=[("a", np.int16, (2,))], layout="aprender")
    assert os.listdir(tmp_path) == []
    out = io.BytesIO()
    with aprfast.Writer(out, plan=[("a", np.int16, (2,))]) as w:
        w.add("a", np.arange(2, dtype=np.int16))
    assert out.getvalue()[:4] == b"APR2"


def test_a_missing_tensor_at_close_is_refused_and_leaves_no_file(tmp_path, no_spool):
    path = tmp_path / "m.apr"
    w = aprfast.Writer(path, plan=[("a", "F32", (2,)), ("b", "F32", (2,))])
    w.add("a", np.ones(2, np.float32))
    with pytest.raises(LayoutError, match=r"1 declared tensors were never added \('b'\); no file was written"):
        w.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(AprError, match="closed writer"):
        w.add("b", np.ones(2, np.float32))


def test_an_existing_target_is_untouched_by_an_incomplete_or_failed_write(tmp_path, no_spool):
    path = tmp_path / "m.apr"
    aprfast.save_file({"old": np.zeros(1, np.float32)}, path)
    before = path.read_bytes()
    with pytest.raises(LayoutError):
        with aprfast.Writer(path, plan=[("a", "F32", (2,)), ("b", "F32", (2,))]) as w:
            w.add("a", np.ones(2, np.float32))
    assert path.read_bytes() == before
    with pytest.raises(RuntimeError):
        with aprfast.Writer(path, plan=[("a", "F32", (2,))]) as w:
            raise RuntimeError("caller failed")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.apr"]


def test_an_incomplete_stream_is_reported_by_its_reader(no_spool):
    out = io.BytesIO()
    w = aprfast.Writer(out, plan=[("a", "F32", (2,)), ("b", "F32", (2,))])
    w.add("a", np.ones(2, np.float32))
    with pytest.raises(LayoutError, match="the output is incomplete"):
        w.close()
    with pytest.raises(CorruptError, match="stream ended"):  # length unknown: found at the end
        list(aprfast.stream(io.BytesIO(out.getvalue())))
    with pytest.raises(CorruptError, match="lie outside"):  # length known: found in the index
        list(aprfast.stream(out.getvalue()))


def test_a_broken_pipe_is_an_io_error_and_closes_the_writer(no_spool):
    r, w = os.pipe()
    os.close(r)
    with os.fdopen(w, "wb", buffering=0) as pipe:
        with pytest.raises(aprfast.AprIOError):
            aprfast.Writer(pipe, plan=[("a", "F32", (2,))])


def test_no_spool_and_no_temporary_files_anywhere(tmp_path, no_spool):
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    path = tmp_path / "m.apr"
    probe = atomic._open_unnamed(str(tmp_path), 0o600)  # -1 without O_TMPFILE (or its fallback forced)
    if probe >= 0:
        os.close(probe)
    with aprfast.Writer(path, plan=[("a", "F32", (1000,)), ("b", "F32", (1000,))]) as w:
        w.add("a", np.ones(1000, np.float32))
        if probe >= 0:
            assert os.listdir(tmp_path) == []  # the file is unnamed until commit (O_TMPFILE)
        else:
            assert len(os.listdir(tmp_path)) == 1  # one named temporary file, renamed at commit
        w.add("b", np.ones(1000, np.float32))
    assert os.listdir(tmp_path) == ["m.apr"]
    assert {n for n in set(os.listdir(tempfile.gettempdir())) - tmp_before if "aprfast" in n or "spool" in n} == set()


MEASURE_WRITER = r"""
import json, os, resource, sys
import numpy as np
import aprfast
n, each = int(sys.argv[1]), int(sys.argv[2])
block = np.ones(each // 4, np.float32)
plan = [(f"layer.{i:03d}", np.float32, block.shape) for i in range(n)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open(os.devnull, "wb") as sink, aprfast.Writer(sink, plan=plan) as w:
    for name, _, _ in plan:
        w.add(name, block)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kib": after - before}))
"""


@pytest.mark.peak_memory
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB is Linux's")
def test_peak_memory_does_not_grow_with_the_model(run_child):
    growth = {}
    for count in (4, 64):  # 16 MiB and 256 MiB models of 4 MiB tensors
        out = run_child(MEASURE_WRITER, count, 4 * MiB, timeout=120)
        assert out.returncode == 0, out.stderr
        growth[count] = json.loads(out.stdout)["growth_kib"] * 1024
    assert growth[64] < 16 * MiB, growth
    assert growth[64] < growth[4] + 8 * MiB, growth


# --- apr inspect - ---------------------------------------------------------------------------
WRITE_TO_STDOUT = r"""
import sys
import numpy as np
import aprfast
layout = sys.argv[1]
tensors = {"emb": np.arange(48, dtype=np.float32).reshape(6, 8), "norm": np.ones(8, np.float16),
           "step": np.array(3, np.int64), "empty": np.zeros((0, 2), np.int8)}
plan = [(n, tensors[n].dtype, tensors[n].shape) for n in sorted(tensors)]
with aprfast.Writer(sys.stdout.buffer, {"name": "piped"}, plan=plan, layout=layout) as w:
    for name, _, _ in plan:
        w.add(name, tensors[name])
"""


def child_env():
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(aprfast.__file__)))
    return dict(os.environ, PYTHONPATH=package_parent)


def pipeline(layout: str, *cli_args, cut: int = 0):
    """``python -c WRITE_TO_STDOUT | python -m aprfast.cli inspect ARGS -``, with real
    pipes between real processes; ``cut`` drops the writer's last bytes on the way."""
    env, cwd = child_env(), tempfile.gettempdir()
    writer = subprocess.Popen([sys.executable, "-c", WRITE_TO_STDOUT, layout], stdout=subprocess.PIPE,
                              env=env, cwd=cwd)
    if cut:
        data = writer.stdout.read()
        writer.stdout.close()
        writer.wait(60)
        return subprocess.run([sys.executable, "-m", "aprfast.cli", "inspect", *cli_args, "-"],
                              input=data[:-cut], capture_output=True, env=env, cwd=cwd, timeout=60)
    inspect = subprocess.Popen([sys.executable, "-m", "aprfast.cli", "inspect", *cli_args, "-"],
                               stdin=writer.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               cwd=cwd)
    writer.stdout.close()  # the inspect process holds the only read end now
    out, err = inspect.communicate(timeout=60)
    assert writer.wait(60) == 0
    return subprocess.CompletedProcess(inspect.args, inspect.returncode, out, err)


def saved_copy(tmp_path, layout):
    tensors = {"emb": np.arange(48, dtype=np.float32).reshape(6, 8), "norm": np.ones(8, np.float16),
               "step": np.array(3, np.int64), "empty": np.zeros((0, 2), np.int8)}
    path = tmp_path / "same.apr"
    aprfast.save_file(tensors, path, {"name": "piped"}, layout=layout)
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apr_inspect_dash_reads_a_writer_piped_into_it(layout, tmp_path, capsys):
    result = pipeline(layout)
    assert result.returncode == 0, result.stderr
    path = saved_copy(tmp_path, layout)
    from aprfast import cli

    assert cli.main(["inspect", str(path)]) == 0
    expected = capsys.readouterr().out
    got = result.stdout.decode()
    assert got.startswith("<stdin>: ")
    assert got.replace("<stdin>", str(path), 1) == expected
    result = pipeline(layout, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(aprfast.inspect(path)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apr_inspect_dash_with_a_cut_stream_exits_4_with_the_code(layout):
    result = pipeline(layout, cut=3)
    assert result.returncode == 4  # a format error (seed 001 Appendix A)
    assert result.stdout == b""
    assert b"[E002]" in result.stderr and b"<stdin>" in result.stderr
