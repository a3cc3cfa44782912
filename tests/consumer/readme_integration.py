#!/usr/bin/env python3
"""Runs one of the README's Integration snippets exactly as printed, as a new user would.

  readme_integration.py --source-dir REPO --work-dir DIR --snippet NAME [--mpiexec mpiexec]

A snippet is the code block after a `<!-- integration: NAME -->` line of README.md. The work
folder holds `herd` (the repository, linked) and `quickstart.cpp`, the README's quickstart block.
An `sh` snippet runs there line by line under bash; a `cmake` snippet is a project's whole
CMakeLists.txt, configured, built and run on 2 ranks (`find_package` first runs the `install`
snippet; `fetch_content`'s placeholder URL becomes an archive of the repository). The program
must print the quickstart's line on both ranks.
"""
import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

EXPECTED = [f"rank {r} of 2: the average of the ranks is 0.5" for r in (0, 1)]


def blocks(readme):
    """{name: (language, text)} of every marked snippet, and the quickstart's C++ block."""
    found = {}
    for match in re.finditer(r"<!-- integration: (\w+) -->\n```(\w+)\n(.*?)```", readme, re.S):
        found[match.group(1)] = (match.group(2), match.group(3))
    quickstart = re.search(r"## Quickstart[^\n]*\n\n```cpp\n(.*?)```", readme, re.S)
    if not quickstart:
        sys.exit("readme_integration: README.md has no quickstart block under '## Quickstart'")
    return found, quickstart.group(1)


def run(command, cwd, shell=False):
    print(f"$ {command if shell else ' '.join(map(str, command))}", flush=True)
    result = subprocess.run(command, cwd=cwd, shell=shell, executable="/bin/bash" if shell else None,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(result.stdout, end="", flush=True)
    if result.returncode != 0:
        sys.exit(f"readme_integration: this step failed with exit code {result.returncode}")
    return result.stdout


def check_output(output, what):
    missing = [line for line in EXPECTED if line not in output]
    if missing:
        sys.exit(f"readme_integration: {what} did not print {missing}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-dir", required=True, type=pathlib.Path)
    parser.add_argument("--work-dir", required=True, type=pathlib.Path)
    parser.add_argument("--snippet", required=True)
    parser.add_argument("--mpiexec", default="mpiexec")
    args = parser.parse_args()

    snippets, quickstart = blocks((args.source_dir / "README.md").read_text())
    if args.snippet not in snippets:
        sys.exit(f"readme_integration: README.md has no '<!-- integration: {args.snippet} -->' block")
    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "herd").symlink_to(args.source_dir.resolve(), target_is_directory=True)
    (work / "quickstart.cpp").write_text(quickstart)

    language, text = snippets[args.snippet]
    if language == "sh":
        output = run("set -euo pipefail\n" + text, work, shell=True)
        if "mpiexec" in text:
            check_output(output, f"snippet '{args.snippet}'")
        return 0
    if language != "cmake":
        sys.exit(f"readme_integration: snippet '{args.snippet}' is ```{language}, neither sh nor cmake")

    project = work
    options = []
    if args.snippet == "find_package":
        run("set -euo pipefail\n" + snippets["install"][1], work, shell=True)
        options.append(f"-DCMAKE_PREFIX_PATH={work / 'herd-install'}")
    if args.snippet == "fetch_content":
        archive = work / "herd-archive.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for name in ("CMakeLists.txt", "cmake", "include", "LICENSE"):
                tar.add(args.source_dir / name, arcname=f"herd/{name}")
        text = re.sub(r"URL [^\s)]+", f"URL {archive.as_uri()}", text, count=1)
    (project / "CMakeLists.txt").write_text(text)
    configured = run(["cmake", "-S", project, "-B", work / "build", *options], work)
    if "CMake Warning" in configured:  # what users see first: a snippet that warns is not finished
        sys.exit("readme_integration: configuring the snippet printed a CMake warning")
    if args.snippet in ("add_subdirectory", "fetch_content"):  # taken as a subproject, herd builds nothing of its own
        targets = run(["cmake", "--build", work / "build", "--target", "help"], work)
        if re.search(r"\b(unit_tests|mpi_tests|fashion_mnist)\b", targets):
            sys.exit("readme_integration: herd added its own tests or examples to the user's project")
    run(["cmake", "--build", work / "build"], work)
    output = run([args.mpiexec, "-n", "2", work / "build" / "quickstart"], work)
    check_output(output, f"the '{args.snippet}' project")
    return 0


if __name__ == "__main__":
    sys.exit(main())
