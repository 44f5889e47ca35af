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
