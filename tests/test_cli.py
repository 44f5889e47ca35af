"""The command line: demo and run from client CSV files."""

import numpy as np
import pytest

from securefkm.cli import main
from securefkm.datasets import FederatedDataset


def test_demo_prints_table_and_writes_plot(tmp_path, capsys):
    plot = tmp_path / "demo.png"
    assert main(["demo", "--clients", "20", "--plot", str(plot), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "central k-means" in out and "DWF federated" in out
    ratio = float(out.split("federated / central score:")[1].split()[0])
    assert ratio < 1.01
    assert plot.stat().st_size > 10_000


def test_run_clusters_csv_directory(tmp_path, capsys):
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 5.0]])
    clients, labels = [], []
    for _ in range(4):
        y = rng.integers(0, 3, 50)
        clients.append(centres[y] + rng.normal(scale=0.3, size=(50, 2)))
        labels.append(y)
    FederatedDataset.from_arrays(clients, labels=labels).to_csv_dir(tmp_path / "clients")
    out_csv = tmp_path / "centres.csv"
    assert main(["run", str(tmp_path / "clients"), "-k", "3", "--label-column", "label", "--out", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert float(text.split("ARI against 'label':")[1].split()[0]) > 0.99
    got = np.loadtxt(out_csv, delimiter=",")
    assert np.allclose(np.sort(got, axis=0), np.sort(centres, axis=0), atol=0.15)


def test_run_reports_bad_input_clearly(tmp_path, capsys):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "a.csv").write_text("x,y\n1,2\n3,oops\n")
    assert main(["run", str(d), "-k", "2"]) == 2
    err = capsys.readouterr().err
    assert "securefkm: error:" in err and "a.csv" in err


def test_unknown_algorithm_is_rejected():
    with pytest.raises(SystemExit):
        main(["run", ".", "-k", "2", "--algorithm", "nope"])


def _labelled_dir(tmp_path, n_clients=4):
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [3.0, 3.0]])
    clients, labels = [], []
    for _ in range(n_clients):
        y = rng.integers(0, 2, 30)
        clients.append(centres[y] + rng.normal(scale=0.3, size=(30, 2)))
        labels.append(y)
    FederatedDataset.from_arrays(clients, labels=labels).to_csv_dir(tmp_path / "clients")
    return str(tmp_path / "clients")


def _walk(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, path + (name,))


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from securefkm.cli import build_parser

    missing = []
    for path, parser in _walk(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"securefkm {' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    run = dict(_walk(build_parser()))[("run",)]
    assert "(default: dwf)" in run.format_help() and "--feature-columns" in run.format_help()
    assert "--label-column" in dict(_walk(build_parser()))[("deploy",)].format_help()


def test_run_refuses_a_label_like_column_unless_told(tmp_path, capsys):
    d = _labelled_dir(tmp_path)
    assert main(["run", d, "-k", "2"]) == 2
    err = capsys.readouterr().err
    assert "'label' looks like a label" in err and "--label-column label" in err and "label_column=" not in err
    assert main(["run", d, "-k", "2", "--feature-columns", "x0,x1"]) == 0
    out = capsys.readouterr().out
    assert "2 features" in out and "ARI" not in out
    assert main(["run", d, "-k", "2", "--label-column", "label"]) == 0
    assert "ARI against 'label'" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--protection", "dp:epsilon=1"], "--protection dp: missing required parameter(s) delta"),
    (["--protection", "dp:epsilon=1:delta=1e-5:colour=red"], "unknown parameter(s) colour"),
    (["--protection", "masking"], "--param init_bounds=[low,high]"),
    (["--protection", "masking", "--algorithm", "kfed", "--param", "init_bounds=[-1,4]"],
     "--param secure_mode=true"),
    (["--protection", "nope"], "unknown --protection layer 'nope'"),
])
def test_refusals_speak_cli_syntax_without_traceback(tmp_path, capsys, args, says):
    d = _labelled_dir(tmp_path)
    assert main(["run", d, "-k", "2", "--label-column", "label", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert "PairwiseMasking(" not in err and "=(low, high)" not in err  # no Python syntax


def test_run_summary_has_score_rounds_privacy_and_report(tmp_path, capsys):
    d = _labelled_dir(tmp_path)
    spec = "dp:epsilon=2:delta=1e-4:bounds=[-2,5]:mode=distributed,masking"
    assert main(["run", d, "-k", "2", "--label-column", "label", "--protection", spec,
                 "--param", "init_bounds=[-2,5]", "--param", "max_rounds=2"]) == 0
    out = capsys.readouterr().out
    for want in ("score (inertia/n):", "rounds:", "privacy spent: epsilon=", "only the noisy sum",
                 "one masked vector per client"):
        assert want in out, want


def test_deploy_prints_progress_and_the_run_summary(tmp_path, capsys, monkeypatch):
    """`deploy` shares `run`'s summary (score, rounds, privacy spent, report) and reports its
    steps; the deployment itself is exercised in tests/test_flower.py."""
    from types import SimpleNamespace

    import securefkm.flower.deploy as deploy_mod
    from securefkm.transcript import Transcript

    def fake_deploy(data, *, progress, **kwargs):
        progress("starting a SuperLink and 4 SuperNodes")
        return SimpleNamespace(centres=np.array([[0.0, 0.0], [3.0, 3.0]]), n_iter=4, privacy_spent=None,
                               protection_report=None, transcript=Transcript(), errors={})

    monkeypatch.setattr(deploy_mod, "deploy", fake_deploy)
    d = _labelled_dir(tmp_path)
    assert main(["deploy", d, "-k", "2", "--label-column", "label"]) == 0
    out = capsys.readouterr().out
    assert "[deploy" in out and "starting a SuperLink" in out
    assert "score (inertia/n):" in out and "rounds: 4" in out and "ARI against 'label': 1.0000" in out
    assert "privacy spent: no differential privacy layer" in out
    assert main(["deploy", d, "-k", "2"]) == 2  # the label column is refused here too
    assert "--label-column label" in capsys.readouterr().err


def _iris_dir(tmp_path, header=True, n_clients=3):
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    d = tmp_path / ("iris" if header else "iris-nohdr")
    d.mkdir()
    for c in range(n_clients):
        rows = [",".join(f"{v:g}" for v in X[i]) + f",{int(y[i])}" for i in range(c, 150, n_clients)]
        head = ["sepal_length,sepal_width,petal_length,petal_width,species"] if header else []
        (d / f"c{c}.csv").write_text("\n".join(head + rows) + "\n")
    return str(d)


def test_run_refuses_iris_species_by_name_and_integer_codes_by_content(tmp_path, capsys):
    d = _iris_dir(tmp_path)
    assert main(["run", d, "-k", "3"]) == 2
    err = capsys.readouterr().err
    assert "column 'species' looks like a label" in err and "--label-column species" in err
    assert main(["run", d, "-k", "3", "--label-column", "species"]) == 0
    assert "4 features" in capsys.readouterr().out
    nohdr = _iris_dir(tmp_path, header=False)
    assert main(["run", nohdr, "-k", "3"]) == 2
    err = capsys.readouterr().err
    assert "column '4' looks like a label" in err and "3 distinct integer values in 50 records" in err
    assert main(["run", nohdr, "-k", "3", "--feature-columns", "0,1,2,3,4"]) == 0  # told: clustered
    assert "5 features" in capsys.readouterr().out


def test_unknown_param_lists_the_valid_names(tmp_path, capsys):
    d = _labelled_dir(tmp_path)
    assert main(["run", d, "-k", "2", "--label-column", "label", "--param", "max_iter=5"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "TypeError" not in err
    assert "has no parameter 'max_iter'" in err and "valid --param names:" in err and "max_rounds" in err
    assert main(["run", d, "-k", "2", "--label-column", "label", "--param", "n_clusters=3"]) == 2
    assert "-k / --clusters" in capsys.readouterr().err


def test_missing_and_nan_values_name_file_line_and_column(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    (d / "a.csv").write_text("a,b\n1,2\n3,4\n")
    (d / "b.csv").write_text("a,b\n1,2\n3,\n")
    assert main(["run", str(d), "-k", "1"]) == 2
    err = capsys.readouterr().err
    assert "b.csv: missing value at line 3 (record 1), column 'b'" in err and "not numeric" not in err
    (d / "b.csv").write_text("a,b\n1,2\nnan,4\n")
    assert main(["run", str(d), "-k", "1"]) == 2
    err = capsys.readouterr().err
    assert "b.csv: 'nan' at line 3 (record 1), column 'a'" in err and "clients[1]" not in err


def test_one_client_under_masking_is_refused_before_any_round(tmp_path, capsys):
    from securefkm import WeightedFederatedKMeans
    from securefkm.exceptions import InputError

    d = tmp_path / "one"
    d.mkdir()
    (d / "a.csv").write_text("a,b\n" + "\n".join(f"{i % 7},{i % 5}" for i in range(40)) + "\n")
    assert main(["run", str(d), "-k", "2", "--protection", "masking", "--param", "init_bounds=[0,7]"]) == 2
    captured = capsys.readouterr()
    assert "PairwiseMasking needs at least 2 clients" in captured.err and "at least 2 files" in captured.err
    assert "retry" not in captured.out + captured.err and "[round" not in captured.out
    X = np.random.default_rng(0).normal(size=(60, 2))
    for prot in (["masking"], ["paillier"]):
        with pytest.raises(InputError, match="groups=") as info:
            WeightedFederatedKMeans(2, protection=prot, init_bounds=(-5, 5), random_state=0).fit(X)
        assert "needs at least 2 clients" in str(info.value)
    with pytest.raises(InputError, match="clients_per_round=1 of 2 clients"):
        WeightedFederatedKMeans(2, protection=["masking"], init_bounds=(-5, 5), clients_per_round=1,
                                random_state=0).fit([X[:30], X[30:]])
    groups = np.repeat([0, 1, 2], 20)  # the fix the message gives runs
    WeightedFederatedKMeans(2, protection=["masking"], init_bounds=(-5, 5), max_rounds=2, backend="local",
                            random_state=0).fit(X, groups=groups)


def test_dp_without_mode_ahead_of_masking_is_distributed_and_said(tmp_path, capsys):
    from securefkm.cli import resolve_dp_mode

    lines = []
    got = resolve_dp_mode([{"name": "dp", "epsilon": 1}, {"name": "masking"}], lines.append)
    assert got[0]["mode"] == "distributed" and len(lines) == 1 and "mode=distributed" in lines[0]
    assert resolve_dp_mode([{"name": "dp", "epsilon": 1}], lines.append)[0]["mode"] == "central"
    assert resolve_dp_mode([{"name": "dp", "mode": "central"}, "masking"], lines.append)[0]["mode"] == "central"
    d = _labelled_dir(tmp_path)
    assert main(["run", d, "-k", "2", "--label-column", "label", "--protection",
                 "dp:epsilon=2:delta=1e-4:bounds=[-2,5],masking", "--param", "max_rounds=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("dp without mode= ahead of masking: mode=distributed") == 1
    assert "each client adds a share of the noise" in out  # the report of a distributed layer


def test_cli_warnings_are_one_line_without_source_paths(capsys):
    import warnings

    from securefkm import cli

    shown = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = cli._one_line_warning
        try:
            warnings.warn("a long\n   message", UserWarning)
        finally:
            warnings.showwarning = shown
    err = capsys.readouterr().err
    assert err == "securefkm: warning: a long message\n"


def test_demo_empty_protection_means_none(tmp_path, capsys):
    assert main(["demo", "--clients", "10", "--plot", str(tmp_path / "d.png"), "--quiet", "--protection", "[]"]) == 0
    out = capsys.readouterr().out
    assert "GaussianDP" not in out and "PairwiseMasking" not in out and "(protected)" not in out
    assert "DWF federated, unprotected" in out and (tmp_path / "d.png").stat().st_size > 10_000
