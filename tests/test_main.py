"""``python -m fastadam``: the demo converges and matches a plain NumPy Adam."""
import fastadam.__main__ as cli


def test_demo_recovers_the_true_weights(capsys):
    err = cli.demo(epochs=10)
    out = capsys.readouterr().out
    assert err < 0.05
    assert "fastadam vs NumPy Adam" in out


def test_config_command(capsys):
    assert cli.main(["config"]) == 0
    assert "simd_level" in capsys.readouterr().out


def test_unknown_command_prints_usage(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "python -m fastadam bench" in capsys.readouterr().out
