"""XGBoost-Ray's own test suite run against unipar.xgboost (the drop-in's specification).

The tests are XGBoost-Ray's (commit e904925, Apache-2.0), vendored in
``tests/xgboost_ray_suite/xgboost_ray/tests``, unchanged but for six tests' calls to
APIs that xgboost 3, scikit-learn 1.8 or Ray 2.10 removed (``EDITED_FOR_TODAYS_LIBRARIES``);
the package ``xgboost_ray`` beside them gives unipar's modules under XGBoost-Ray's names.
Each file runs in its own pytest process (its tests start and stop their own local Ray).
Nothing is fetched.

Left out, by name: tests that download data sets (no internet here), that need Ray
Client (``grpc`` not installed), Modin, Dask or Petastorm (not installed); each only
while what it needs is missing.

    python benchmarks/xgboost_ray_suite.py            # the seven files of the issue
    python benchmarks/xgboost_ray_suite.py --fast     # the quick part (``make test``)
    python benchmarks/xgboost_ray_suite.py --files test_matrix.py test_tune.py

Ends with ``RESULT suite_pass_rate=<passed/collected> ...`` (collected: after leaving
out).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

SUITE = Path(__file__).resolve().parent.parent / "tests" / "xgboost_ray_suite"
TESTS = SUITE / "xgboost_ray" / "tests"

FILES = (
    "test_end_to_end.py",
    "test_sklearn.py",
    "test_xgboost_api.py",
    "test_tune.py",
    "test_matrix.py",
    "test_data_source.py",
    "test_fault_tolerance.py",
)

# The quick part, for `make test` (pytest -k expressions, each for its file's tests):
# three files, run in one pytest process (each process costs 15-20 s of imports before
# its first test on the shared 2-core machine). All of
# test_matrix.py but its two differences (one Ray for the class: 19 tests in ~15 s),
# train and predict with every distributed hook, keyword validation, and a killed actor
# replaced mid-training. The other files' areas have cheaper tests of unipar's own
# (tests/test_xgboost_sklearn.py, test_xgboost_sources.py, test_xgboost_tune.py).
FAST = {
    "test_matrix.py": "not testLegacyParams and not testFeatureWeightsParam",
    "test_end_to_end.py": "testDistributedCallbacksTrainPredict or testKwargsValidation",
    "test_fault_tolerance.py": "testTrainingContinuationKilled and not Elastic",
}


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


INTERNET = "downloads a data set (sklearn's fetch_california_housing): no internet here"
CLIENT = "needs Ray Client, whose grpc package is not installed"
MODIN = "needs Modin, not installed"
DASK = "needs Dask, not installed"
PETASTORM = "needs Petastorm, not installed"

# (file, test id within the file, reason, whether to leave it out now)
LEFT_OUT = [
    *[
        ("test_sklearn.py", f"XGBoostRaySklearnTest::{name}", INTERNET, True)
        for name in (
            "test_num_parallel_tree",
            "test_california_housing_regression",
            "test_california_housing_rf_regression",
            "test_parameter_tuning",
            "test_regression_with_custom_objective",
        )
    ],
    *[
        ("test_end_to_end.py", f"XGBoostRayEndToEndTest::{name}", CLIENT, _missing("grpc"))
        for name in ("testTrainPredictClient", "testDistributedCallbacksTrainPredictClient")
    ],
    ("test_tune.py", "XGBoostRayTuneTest::testNumItersClient", CLIENT, _missing("grpc")),
    *[
        ("test_matrix.py", f"XGBoostRayDMatrixTest::{name}", MODIN, _missing("modin"))
        for name in ("testFromModinDfDf", "testFromModinDfSeries", "testFromModinDfString")
    ],
    *[
        ("test_matrix.py", f"XGBoostRayDMatrixTest::{name}", DASK, _missing("dask"))
        for name in ("testFromDaskDfSeries", "testFromDaskDfArray", "testFromDaskDfString")
    ],
    (
        "test_matrix.py",
        "XGBoostRayDMatrixTest::testFromPetastormParquetString",
        PETASTORM,
        _missing("petastorm"),
    ),
    ("test_data_source.py", "ModinDataSourceTest", MODIN, _missing("modin")),
    ("test_data_source.py", "DaskDataSourceTest", DASK, _missing("dask")),
]


# Tests edited where they call an API that today's xgboost, scikit-learn or Ray removed
# (xgboost 3.2, scikit-learn 1.9, Ray 2.60 here): the edit, marked "# unipar:" in the
# file, swaps in the replacement API, the test's checks unchanged (docs/xgboost.md).
EDITED_FOR_TODAYS_LIBRARIES = {
    ("test_xgboost_api.py", "XGBoostAPITest::testCustomMetricFunction"): (
        "its reference xgboost.train(..., feval=rmsle) -> custom_metric=rmsle (xgboost 3 "
        "has no feval)"
    ),
    ("test_sklearn.py", "XGBoostRaySklearnTest::test_validation_weights_xgbmodel"): (
        "its xgboost.XGBModel.fit(..., eval_metric='logloss') -> XGBModel(eval_metric="
        "'logloss') (xgboost 3 takes it in the constructor only)"
    ),
    ("test_sklearn.py", "XGBoostRaySklearnTest::test_sklearn_get_default_params"): (
        "its get_basescore(): float(base_score) -> the first value of the vector that "
        "xgboost 3 writes ('[5E-1]')"
    ),
    ("test_sklearn.py", "XGBoostRaySklearnTest::test_pandas_input"): (
        "CalibratedClassifierCV(model, cv='prefit') -> CalibratedClassifierCV("
        "FrozenEstimator(model)) (scikit-learn 1.8 removed 'prefit'), and the estimator "
        "checked is the one inside FrozenEstimator"
    ),
    ("test_tune.py", "XGBoostRayTuneTest::testEndToEndCheckpointing"): (
        "tune.run(local_dir=...) -> storage_path=... (Ray 2.10 removed local_dir)"
    ),
    ("test_tune.py", "XGBoostRayTuneTest::testEndToEndCheckpointingOrigTune"): (
        "tune.run(local_dir=...) -> storage_path=... (Ray 2.10 removed local_dir)"
    ),
}


@dataclass
class FileResult:
    name: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test -> first line of its error
    left_out: list[str] = field(default_factory=list)
    deselected: int = 0  # tests left out (a class left out counts all its tests)
    seconds: float = 0.0

    @property
    def collected(self) -> int:
        return len(self.passed) + len(self.failed)


def run_files(
    names: list[str], selected: str = "", log_dir: Path | None = None, timeout_s: float = 3600
) -> tuple[list[FileResult], float]:
    """Run vendored files in one pytest process; ``selected``: a pytest ``-k`` expression
    choosing tests (all when empty); ``log_dir``: where its output goes. Returns each
    file's result and the process's wall time."""
    results = {name: FileResult(name) for name in names}
    deselect = []
    for file, test, _, leave_out in LEFT_OUT:
        if file in results and leave_out:
            deselect += ["--deselect", f"xgboost_ray/tests/{file}::{test}"]
            results[file].left_out.append(test)
    # RAY_ADDRESS=local: the tests' ray.init() starts a Ray of their own instead of
    # joining one found on this machine. RAY_TRAIN_V2_ENABLED=0: the tests' own code
    # calls ray.train.get_context() inside Tune trials, which Ray Train v2 (Ray 2.60's
    # default) refuses; v1, which Ray still ships, answers it (unipar works with both).
    env = {
        **os.environ,
        "PYTHONPATH": str(SUITE),
        "RAY_ADDRESS": "local",
        "RAY_TRAIN_V2_ENABLED": "0",
    }
    label = names[0] if len(names) == 1 else "quick-part"
    problem = ""
    with tempfile.TemporaryDirectory() as scratch:
        report = (log_dir or Path(scratch)) / f"{label}.xml"  # with each test's seconds
        report.unlink(missing_ok=True)  # a report of an earlier run is not this one's
        command = [
            sys.executable,
            "-m",
            "pytest",
            *[f"xgboost_ray/tests/{name}" for name in names],
            "-q",
            "-p",
            "no:cacheprovider",
            f"--confcutdir={SUITE}",
            f"--rootdir={SUITE}",
            f"--junitxml={report}",
            *deselect,
        ]
        if selected:
            command += ["-k", selected]
        started = time.perf_counter()
        log = (log_dir or Path(scratch)) / f"{label}.log"
        with open(log, "w") as output:
            try:
                subprocess.run(
                    command,
                    cwd=SUITE,
                    env=env,
                    timeout=timeout_s,
                    check=False,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            except subprocess.TimeoutExpired:
                problem = f"timed out after {timeout_s:.0f} s"
        seconds = time.perf_counter() - started
        found = re.findall(r"(\d+) deselected", log.read_text())
        for result in results.values():
            result.deselected = len(result.left_out)
        if found and not selected and len(names) == 1:  # a class left out: all its tests
            results[names[0]].deselected = int(found[-1])
        if report.exists():
            _read_report(report, results)
        else:
            problem = problem or "pytest wrote no report (it crashed)"
    for result in results.values():
        if problem:
            result.failed["(file)"] = problem
        if len(names) == 1:
            result.seconds = seconds
    return list(results.values()), seconds


def _read_report(report: Path, results: dict[str, FileResult]) -> None:
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        result = results[module.rpartition(".")[2] + ".py"]
        test = f"{cls}::{case.get('name')}"
        if len(results) > 1:  # one process for several files: the tests' own seconds
            result.seconds += float(case.get("time") or 0)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            result.failed[test] = message[0][:200] if message else "failed"
        elif skipped is not None:  # a skip counts as not passed: it was not left out
            result.failed[test] = "skipped: " + (skipped.get("message") or "")[:180]
        else:
            result.passed.append(test)


def _fast_selection() -> str:
    """One ``-k`` expression for the quick part's files in one process: each file's
    expression applies to its own tests (a file's module name is one of its tests'
    keywords)."""
    return " or ".join(f"({name[:-3]} and ({expression}))" for name, expression in FAST.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="+", default=list(FILES), help="vendored test files")
    parser.add_argument("--fast", action="store_true", help="only the quick part")
    parser.add_argument("-k", dest="select", default="", help="a pytest -k expression")
    parser.add_argument("--log-dir", type=Path, help="keep each file's pytest output here")
    args = parser.parse_args(argv)
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)
    # The quick part: one process, whose 15-20 s of imports are then paid once.
    runs = (
        [(list(FAST), _fast_selection())]
        if args.fast
        else [([name], args.select) for name in args.files]
    )
    results, seconds = [], 0.0
    for names, selected in runs:
        file_results, run_seconds = run_files(names, selected, args.log_dir)
        seconds += run_seconds
        for result in file_results:
            results.append(result)
            print(
                f"{result.name}: {len(result.passed)} passed, {len(result.failed)} failed, "
                f"{result.collected} collected, {result.deselected} left out "
                f"({result.seconds:.0f} s)",
                flush=True,
            )
            for test, why in result.failed.items():
                print(f"  FAILED {test}: {why}")
    print("\nLeft out (not collected):")
    reasons = {(f, t): why for f, t, why, leave in LEFT_OUT if leave}
    for result in results:
        for test in result.left_out:
            print(f"  {result.name}::{test}: {reasons[(result.name, test)]}")
    print("\nEdited where they call an API removed from xgboost, scikit-learn or Ray:")
    for result in results:
        for test in [*result.passed, *result.failed]:
            change = EDITED_FOR_TODAYS_LIBRARIES.get((result.name, test))
            if change is not None:
                state = "passed" if test in result.passed else "failed"
                print(f"  {result.name}::{test} ({state}): {change}")
    passed = sum(len(r.passed) for r in results)
    collected = sum(r.collected for r in results)
    left_out = sum(r.deselected for r in results)
    rate = passed / collected if collected else 0.0
    print(
        f"RESULT suite_pass_rate={rate:.3f} passed={passed} collected={collected} "
        f"left_out={left_out} seconds={seconds:.0f}"
    )


if __name__ == "__main__":
    main()
