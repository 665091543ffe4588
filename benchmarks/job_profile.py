"""Where a local job's processes spend their CPU: `perf record -a` over `job_cost.py`.

`job_cost.py` says how much CPU a `true` job's processes take; this says on what. It samples
the whole machine with Linux `perf` (Debian's `linux-perf`; run as root, or with
`kernel.perf_event_paranoid` at most 0) while `job_cost.py` runs, then sorts each sample of
`jobwrap` and of the command (`true`) by the kernel or C-library work it is in.

    .venv/bin/python benchmarks/job_profile.py [--jobs 600]
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: What a sample is doing, by a function on its call chain; the first that matches counts.
KINDS = [
    (
        "C library start-up (cpuid)",
        r"intel_check_word|handle_intel|init_cpu_features|get_common_|update_active|cache_info",
    ),
    ("ext4: creating a file", r"__ext4_new_inode|ext4_create|recently_deleted"),
    ("network namespace", r"copy_net_ns|setup_net|cleanup_net|ops_init|unshare_nsproxy|put_net"),
    ("exec", r"do_execveat|bprm_execve|load_elf_binary|begin_new_exec"),
    ("fork", r"copy_process|kernel_clone"),
    ("exit", r"do_exit|exit_mmap|mmput"),
    ("page faults", r"asm_exc_page_fault|handle_mm_fault"),
    ("other files", r"do_sys_openat2|vfs_write|ksys_write|do_unlinkat|do_renameat"),
]
PROGRAMS = ("jobwrap", "true")


def classify(script: str) -> tuple[collections.Counter[str], collections.Counter[tuple[str, str]]]:
    """Samples per program, and per (program, kind), from `perf script -F comm,ip,sym`."""
    totals: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[tuple[str, str]] = collections.Counter()
    for sample in script.split("\n\n"):
        lines = [line for line in sample.splitlines() if line.strip()]
        if not lines:
            continue
        program = lines[0].split()[0]
        chain = " ".join(lines[1:])
        totals[program] += 1
        kind = next((name for name, pattern in KINDS if re.search(pattern, chain)), "other")
        kinds[(program, kind)] += 1
    return totals, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    args = parser.parse_args()
    perf = shutil.which("perf")
    if perf is None:
        sys.exit("job_profile.py: needs Linux perf (Debian: apt-get install linux-perf)")
    job_cost = Path(__file__).with_name("job_cost.py")
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "perf.data")
        record = [perf, "record", "-a", "-g", "-o", data, "--", sys.executable, str(job_cost)]
        subprocess.run([*record, "--jobs", str(args.jobs)], check=True)
        script = subprocess.run(
            [perf, "script", "-i", data, "--comms", ",".join(PROGRAMS), "-F", "comm,ip,sym"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    totals, kinds = classify(script)
    for program in PROGRAMS:
        print(f"{program}: {totals[program]} samples")
        for (name, kind), count in kinds.most_common():
            if name == program:
                print(f"  {kind:28} {count / totals[program]:6.1%}")


if __name__ == "__main__":
    main()
