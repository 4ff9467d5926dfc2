"""Before and after the first steps: bf16 on a CPU without it is said before any work (``mygpt train``, the
pipeline's settings check), and after the first timed steps the run's whole wall time is estimated, once, in the
log (the chapter's "time 50 steps and extrapolate", done by the tool)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mygpt.cli import main
from mygpt.limits import cpu_lacks_bf16
from tasks.model import ModelSettings
from tests.support import REPO
from tests.support.tiny_model import flags

TINY = flags(embed_dim=16, num_layers=1, num_heads=2, max_seq_len=16, seq_len=16, batch_size=2)


@pytest.fixture(scope="module")
def text(tmp_path_factory, shakespeare_text):
    path = tmp_path_factory.mktemp("estimate") / "small.txt"
    path.write_text(shakespeare_text[:20_000], encoding="utf-8")
    return path


def test_the_run_is_estimated_once_after_its_first_timed_steps(capsys, text, tmp_path):
    argv = ["train", text, "--device", "cpu", *TINY, "--steps", "20", "--print-every", "5"]
    assert main([str(a) for a in [*argv, "--output", tmp_path / "m.ckpt"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    estimates = [i for i, line in enumerate(lines) if line.startswith("estimate: ")]
    assert len(estimates) == 1, lines
    line = lines[estimates[0]]
    duration = r"\d+(\.\d)? (s|min|h)"
    assert re.fullmatch(rf"estimate: the run's 20 steps take about {duration} \(\S+ s per step over 4 timed "
                        rf"step\(s\); {duration} from now\)", line), line  # fmt: skip
    assert lines[estimates[0] + 1] == next(x for x in lines if x.startswith("step 5: loss = "))


def test_cpuinfo_tells_a_cpu_without_native_bf16(tmp_path):
    without, avx512, arm, unknown = (tmp_path / name for name in ("without", "avx512", "arm", "unknown"))
    without.write_text("processor: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    avx512.write_text("processor: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
    arm.write_text("processor: 0\nFeatures\t: fp asimd bf16 i8mm\n")
    unknown.write_text("processor: 0\n")
    assert cpu_lacks_bf16(str(without))
    assert not any(cpu_lacks_bf16(str(p)) for p in (avx512, arm, unknown, tmp_path / "missing"))


needs_a_cpu_without_bf16 = pytest.mark.skipif(not cpu_lacks_bf16(), reason="this CPU has native bf16")


@needs_a_cpu_without_bf16
def test_bf16_on_this_cpu_is_a_warning_of_the_pipelines_settings_check():
    assert any("model.precision=bf16 on a CPU without native bf16" in w
               for w in ModelSettings(device="cpu", precision="bf16").warnings())  # fmt: skip
    assert not any("bf16" in w for w in ModelSettings(device="cpu", precision="fp32").warnings())


@needs_a_cpu_without_bf16
def test_bf16_on_this_cpu_is_said_before_the_tokenizer_is_trained(text, tmp_path):
    argv = [*TINY, "--device", "cpu", "--precision", "bf16", "--tokenizer", "bpe", "--num-merges", "20"]
    done = subprocess.run(
        [sys.executable, "-m", "mygpt.cli", "train", str(text), *argv, "--steps", "2", "--output", str(tmp_path / "m")],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: precision bf16 on "))
    assert warning < next(i for i, line in enumerate(lines) if line.startswith("training BPE tokenizer")), lines
