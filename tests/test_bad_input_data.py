"""A catalogue of bad data files, each refused in one line naming the file and what is wrong; and
the quiet degradation of natural clients without test data, warned once.

Data files are input as settings are: LEAF's FEMNIST JSON (``dataset=femnist``), a CSV table
(``dataset=table``) and a Hugging Face dataset (``dataset=huggingface``, skipped without the
``datasets`` package) are written here with one fault each.  Every case runs fedrun's console
entry point (in one driver process: tests/cli_driver.py) in an empty working folder and must exit
2 with exactly one line on stderr, ``fedrun: error: <file or setting>: <what is wrong, naming the
writer, line or example>: <what is allowed>``, no traceback; create nothing in the working folder
(no run directory) nor in Hugging Face's cache, ask no network for a local path, and leave the
input files as they were.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import created_in, refusal_failures
from test_bad_input import run_catalogue as catalogue

RUN = ["model=mlp", "model.hidden=[8]", "hyperparams.rounds=1", "hyperparams.client_fraction=1.0",
       "partition=natural", "progress=false"]


def run_catalogue(cases, tmp_path: Path) -> list[dict]:
    """Each case (args, expected, env) in its own empty working folder below ``tmp_path`` (made
    here), all in one driver process (tests/test_bad_input.py's catalogue runner)."""
    tmp_path.mkdir(exist_ok=True)
    return catalogue(cases, tmp_path)


def tree(folder: Path) -> dict:
    """Every file's bytes below ``folder`` (and every folder, as None)."""
    return {str(p): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def check_refusals(cases, tmp_path: Path, inputs: Path) -> None:
    before = tree(inputs)
    problems = []
    for (args, expected, _), result in zip(cases, run_catalogue(cases, tmp_path / "work")):
        failed = refusal_failures(result, expected, named="names the file and what is wrong")
        if failed:
            problems.append(f"{' '.join(args)}: {', '.join(failed)} (exit {result['code']}; created "
                            f"{created_in(result)}):\n{result['stderr'][-1500:]}")
    assert not problems, "\n\n".join(problems)
    assert tree(inputs) == before  # the bad files are read, never changed


# ----------------------------------------------------------------------------- LEAF's FEMNIST JSON

def leaf_data(rng, writers=("w1", "w2"), n=3) -> dict:
    return {"users": list(writers), "num_samples": [n] * len(writers),
            "user_data": {w: {"x": rng.random((n, 784)).round(3).tolist(), "y": [1, 2, 3][:n]} for w in writers}}


def write_leaf(root: Path, fault=None, split: str = "train") -> str:
    """LEAF's layout under ``root`` (``femnist/data/{train,test}/a.json``, two writers of three images),
    ``fault(data, folder)`` applied to ``split``'s data before it is written (it may write files of its own)."""
    rng = np.random.default_rng(0)
    for name in ("train", "test"):
        folder = root / "femnist" / "data" / name
        folder.mkdir(parents=True)
        data = leaf_data(rng)
        text = None
        if fault is not None and name == split:
            text = fault(data, folder)
        (folder / "a.json").write_text(text if isinstance(text, str) else json.dumps(data))
    return str(root)


def _set(path: tuple, value):
    def fault(data, folder):
        node = data["user_data"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return fault


def _duplicate_key(data, folder):  # w2's block written twice: json.loads would keep the second
    text = json.dumps(data)
    block = json.dumps(data["user_data"]["w2"])
    return text.replace('"w2": ' + block, '"w2": ' + block + ', "w2": ' + block)


LEAF = {  # name: (fault, split, what the line says after the file)
    "writer_twice_in_users": (lambda d, f: (d["users"].append("w1"), d["num_samples"].append(3)) and None, "train",
                              ["writer w1 is listed twice in users", "each writer once in a split"]),
    "writer_in_two_files": (lambda d, f: (f / "b.json").write_text(json.dumps(
        {"users": ["w1"], "num_samples": [3], "user_data": {"w1": d["user_data"]["w1"]}})) and None, "train",
        ["b.json: writer w1 is listed in", "a.json too", "each writer once in a split"]),
    "label_3.7": (_set(("w1", "y", 0), 3.7), "train",
                  ["writer w1, image 0: label 3.7 is not an integer", "integers 0..61"]),
    "label_true": (_set(("w2", "y", 1), True), "train", ["writer w2, image 1: label true is not an integer"]),
    "label_string": (_set(("w2", "y", 2), "4"), "train", ["writer w2, image 2: label \"4\" is not an integer"]),
    "label_62": (_set(("w1", "y", 1), 62), "test", ["writer w1, image 1: label 62 is outside 0..61"]),
    "pixel_nan": (_set(("w2", "x", 1, 5), float("nan")), "train",
                  ["writer w2, image 1, pixel 5: NaN is not a number in [0, 1]"]),
    "pixel_inf_in_test": (_set(("w1", "x", 0, 0), float("inf")), "test",
                          ["test/a.json: writer w1, image 0, pixel 0: Infinity is not a number in [0, 1]"]),
    "pixel_255": (_set(("w1", "x", 2, 9), 255), "train",
                  ["writer w1, image 2, pixel 9: 255 is not a number in [0, 1]", "scaled by 1/255"]),
    "pixel_string": (_set(("w2", "x", 0, 3), "0.5"), "train",
                     ["writer w2, image 0, pixel 3: \"0.5\" is not a number in [0, 1]"]),
    "ragged_row": (_set(("w2", "x", 1), [0.5] * 700), "train",
                   ["writer w2, image 1: 700 values: FEMNIST images are rows of 784 pixels"]),
    "writer_data_twice": (_duplicate_key, "train", ["the key 'w2' appears twice in one JSON object"]),
    "writer_not_listed": (lambda d, f: d["user_data"].update(w9=d["user_data"]["w1"]), "train",
                          ["user_data holds writer w9, which users does not list"]),
    "num_samples_wrong": (lambda d, f: d["num_samples"].__setitem__(0, 5), "train",
                          ["writer w1: num_samples says 5 but it has 3 images"]),
    "num_samples_too_short": (lambda d, f: d.update(num_samples=[3]), "train",
                              ["num_samples must list one count per writer of users (2), not [3]"]),
    "labels_fewer_than_images": (_set(("w2", "y"), [1, 2]), "train", ["writer w2 has 3 images but 2 labels"]),
    "latin1": (lambda d, f: (f / "b.json").write_bytes('{"users": ["\u00e9"]}'.encode("latin-1")) and None, "train",
               ["b.json: not UTF-8 text (byte 0xe9", "JSON, written in UTF-8"]),
    "empty_file": (lambda d, f: (f / "b.json").write_bytes(b"") and None, "train", ["b.json: is empty"]),
    "folder_named_json": (lambda d, f: (f / "b.json").mkdir(), "train", ["b.json: is a folder, not a LEAF .json"]),
}


def test_every_bad_leaf_file_is_one_line_naming_the_file_and_the_writer(tmp_path):
    inputs, cases = tmp_path / "inputs", []
    for name, (fault, split, expected) in LEAF.items():
        root = write_leaf(inputs / name, fault, split)
        cases.append((["dataset=femnist", f"dataset.load.root={root}", "hyperparams.num_clients=2", *RUN],
                      [f"{root}/femnist/data/{split}/", *expected], {}))
    train = inputs / "writer_twice_in_users" / "femnist" / "data" / "train" / "a.json"  # a file for the folder
    cases.append((["dataset=femnist", f"dataset.load.train={train}", f"dataset.load.root={inputs / 'label_62'}",
                   "hyperparams.num_clients=2", *RUN], [f"dataset.load.train: {train} is a file, not a folder"], {}))
    check_refusals(cases, tmp_path, inputs)


# ----------------------------------------------------------------------------- CSV tables

HEADER = "client,label,f0,f1\n"
ROWS = "".join(f"{c},{i % 3},0.{i + 1},0.{9 - i % 9}\n" for i, c in enumerate("aabbccaabbcc"))  # lines 2-13


def table_case(name: str, data, *settings: str, expected: list[str]):
    """(file name, its bytes or text, extra settings, what the line says)."""
    return name, data, list(settings), expected


TABLES = [
    table_case("extra_field.csv", HEADER + ROWS + "a,1,0.1,0.2,0.9\n",
               expected=["line 14 has 5 fields but the header names 4 columns", "one value per column"]),
    table_case("missing_field.csv", HEADER + ROWS + "a,1,0.1\n", expected=["line 14 has 3 fields"]),
    table_case("column_twice.csv", "client,label,f0,f0\n" + ROWS,
               expected=["column 'f0' is named twice in the header (columns 3 and 4)", "name each column once"]),
    table_case("label_as_feature.csv", HEADER + ROWS, "dataset.load.feature_columns=[f0,label]",
               expected=["dataset.load.feature_columns=['f0', 'label']: lists label, the label column"]),
    table_case("client_as_feature.csv", HEADER + ROWS, "dataset.load.feature_columns=[client,f1]",
               expected=["dataset.load.feature_columns=['client', 'f1']: lists client, the client column"]),
    table_case("feature_twice.csv", HEADER + ROWS, "dataset.load.feature_columns=[f0,f0]",
               expected=["dataset.load.feature_columns=['f0', 'f0']: lists f0 twice"]),
    table_case("client_is_label.csv", HEADER + ROWS, "dataset.load.client_column=label",
               expected=["dataset.load.client_column=label: is dataset.load.label_column too"]),
    table_case("empty.csv", b"", expected=["is empty (0 bytes)", "a header row naming the columns"]),
    table_case("blank.csv", "\n \n", expected=["is empty (3 bytes of white space)"]),
    table_case("latin1.csv", (HEADER + ROWS + "\u00e9,1,0.1,0.2\n").encode("latin-1"),
               expected=["line 14: byte 0xe9 is not UTF-8", "save the table as UTF-8"]),
    table_case("nan.csv", HEADER + ROWS + "a,1,nan,0.2\n", expected=["line 14, column f0: 'nan' is not finite"]),
    table_case("inf.csv", HEADER + ROWS + "b,1,0.3,-inf\n", expected=["line 14, column f1: '-inf' is not finite"]),
    table_case("float32_overflow.csv", HEADER + ROWS + "a,1,1e39,0.2\n",
               expected=["line 14, column f0: '1e39' is not finite (in float32)"]),
    table_case("empty_cell.csv", HEADER + ROWS + "a,1,,0.2\n",
               expected=["line 14, column f0: '' is not a number", "features are finite numbers"]),
    table_case("label_3.7.csv", HEADER + ROWS + "a,3.7,0.1,0.2\n",
               expected=["line 14: label '3.7' is not an integer", "labels are integers 0..C-1"]),
    table_case("label_negative.csv", HEADER + ROWS + "a,-1,0.1,0.2\n",
               expected=["line 14: label -1 is outside 0..2 (dataset.num_classes=3)"]),
    table_case("label_3_of_3.csv", HEADER + "a,3,0.1,0.2\n" + ROWS, expected=["line 2: label 3 is outside 0..2"]),
    table_case("no_client.csv", HEADER + ROWS + ",1,0.1,0.2\n",
               expected=["line 14: the client column client is empty"]),
    table_case("header_only.csv", HEADER, expected=["dataset.load.path:", "header_only.csv has a header but no row"]),
]


def test_every_bad_table_is_one_line_naming_the_file_and_the_line(tmp_path):
    inputs, cases = tmp_path / "inputs", []
    inputs.mkdir()
    for name, data, settings, expected in TABLES:
        path = inputs / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        first = expected[0] if expected[0].startswith("dataset.load.") else f"{path}: {expected[0]}"  # the file first
        cases.append((["dataset=table", f"dataset.load.path={path}", "dataset.num_classes=3", "dataset.image_size=2",
                       "hyperparams.num_clients=3", *settings, *RUN], [first, *expected[1:]], {}))
    (inputs / "folder.csv").mkdir()
    cases.append((["dataset=table", f"dataset.load.path={inputs / 'folder.csv'}", "dataset.num_classes=3", *RUN],
                  [f"dataset.load.path: {inputs / 'folder.csv'} is a folder, not a CSV file"], {}))
    check_refusals(cases, tmp_path, inputs)


def test_a_byte_order_mark_is_read_as_one_not_as_part_of_the_first_column(tmp_path):
    from fedrun.data.natural import table

    (tmp_path / "plain.csv").write_text(HEADER + ROWS)
    (tmp_path / "bom.csv").write_text(HEADER + ROWS, encoding="utf-8-sig")  # as Excel's "CSV UTF-8" writes
    plain, bom = table(str(tmp_path / "plain.csv"), image_size=2), table(str(tmp_path / "bom.csv"), image_size=2)
    for field in ("train_x", "train_y", "train_groups", "test_x", "test_y", "test_groups"):
        assert getattr(plain, field).equal(getattr(bom, field)), field


# ----------------------------------------------------------------------------- Hugging Face

@pytest.fixture
def hf_inputs(tmp_path):
    """Saved datasets with one fault each, a folder that is no dataset, a parquet file; offline."""
    if importlib.util.find_spec("datasets") is None:
        pytest.skip("pip install 'fedrun[huggingface]'")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before datasets is imported: never the network
    import datasets

    rng = np.random.default_rng(0)
    n, folder = 12, tmp_path / "inputs"
    ints = [rng.integers(0, 256, (8, 8)).astype(np.uint8) for _ in range(n)]
    floats = [rng.random((8, 8)).astype(np.float32) for _ in range(n)]
    labels, writers = [i % 3 for i in range(n)], [f"w{i % 3}" for i in range(n)]

    def save(name, images, labels=labels, writers=writers, features=None):
        ds = datasets.Dataset.from_dict({"image": images, "label": labels, "writer": writers}, features=features)
        datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(folder / name))

    nan = [f.copy() for f in floats]
    nan[4][2, 3] = np.nan
    save("nan_pixel", nan)
    save("floats_of_255", [f * 255 for f in floats])
    save("label_2.7", floats, [float(v) + (0.7 if i == 5 else 0) for i, v in enumerate(labels)])
    save("label_minus_1", ints, [-1 if i == 2 else v for i, v in enumerate(labels)],
         features=datasets.Features({"image": datasets.Array2D((8, 8), "uint8"),
                                     "label": datasets.ClassLabel(names=["a", "b", "c"]),
                                     "writer": datasets.Value("string")}))
    save("label_none", floats, [None if i == 3 else v for i, v in enumerate(labels)])
    save("writer_none", floats, writers=[None if i == 7 else w for i, w in enumerate(writers)])
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"image": ints, "label": labels, "writer": writers}),
                          "test": datasets.Dataset.from_dict({"image": ints, "label": labels})}).save_to_disk(
        str(folder / "test_without_writer"))
    (folder / "text_folder").mkdir()
    (folder / "text_folder" / "notes.txt").write_text("not a dataset\n")
    datasets.Dataset.from_dict({"image": [f.flatten().tolist() for f in floats], "label": labels}).to_parquet(
        str(folder / "train.parquet"))
    return folder


def test_every_bad_hugging_face_input_is_one_line_and_local_paths_never_reach_the_hub(hf_inputs, tmp_path):
    f = hf_inputs
    hf_home = tmp_path / "hf_home"  # datasets' cache: nothing may be written there
    env = {"HF_HOME": str(hf_home), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    base = ["dataset=huggingface", "dataset.image_size=8", "dataset.num_classes=3", "hyperparams.num_clients=3", *RUN]
    local = "no such file or folder (a local path, so the Hub is not asked)"
    cases = [
        (["dataset.load.path=./my_hf_data"], ["dataset.load.path=./my_hf_data: " + local]),
        (["dataset.load.path=my_hf_data"], ["dataset.load.path=my_hf_data: " + local, "a Hub name (owner/name)"]),
        (["dataset.load.path=data/mine/v2"], ["dataset.load.path=data/mine/v2: " + local]),
        ([f"dataset.load.path={f / 'missing'}"], [f"dataset.load.path={f / 'missing'}: " + local]),
        ([f"dataset.load.path={f / 'text_folder'}"], [f"dataset.load.path={f / 'text_folder'}: is a folder that "
                                                      "save_to_disk did not write", "dataset.load.path=imagefolder"]),
        ([f"dataset.load.path={f / 'train.parquet'}"],
         [f"dataset.load.path={f / 'train.parquet'}: is a file", "dataset.load.path=parquet dataset.load.data_files="]),
        (["dataset.load.path=parquet"], ["dataset.load.path=parquet: is a builder of local files",
                                         "dataset.load.data_files"]),
        (["dataset.load.path=parquet", f"dataset.load.data_files={{train: {f / 'nope.parquet'}}}"],
         [f"dataset.load.data_files={f / 'nope.parquet'}: no such file"]),
        (["dataset.load.path=imagefolder", "dataset.load.data_dir=photos"], ["dataset.load.data_dir=photos: no such "
                                                                             "folder"]),
        ([f"dataset.load.path={f / 'nan_pixel'}"], [f"the training image of example 4 of {f / 'nan_pixel'} holds nan",
                                                    "floats in [0, 1]"]),
        ([f"dataset.load.path={f / 'floats_of_255'}"], ["dataset.load.image_column: the training image of example 0",
                                                        "pixels are integers 0..255, or floats in [0, 1]"]),
        ([f"dataset.load.path={f / 'label_2.7'}"], ["dataset.load.label_column: the training label of example 5",
                                                    "is 2.7: labels are integers"]),
        ([f"dataset.load.path={f / 'label_minus_1'}"], ["the training label of example 2", "is -1: labels are "
                                                        "integers 0..2"]),
        ([f"dataset.load.path={f / 'label_none'}"], ["the training label of example 3", "is None"]),
        ([f"dataset.load.path={f / 'writer_none'}", "dataset.load.client_column=writer"],
         ["dataset.load.client_column: the training example 7", "has no client (None)"]),
        ([f"dataset.load.path={f / 'test_without_writer'}", "dataset.load.client_column=writer"],
         ["dataset.load.client_column=writer: is not a column of", "test_without_writer's test split"]),
    ]
    check_refusals([([*base, *args], expected, env) for args, expected in cases], tmp_path, f)
    cached = [p for p in hf_home.rglob("*") if p.is_file() and p.suffix in (".arrow", ".json")]
    assert not cached, cached  # nothing read as text and cached before the refusal


# ----------------------------------------------------------------------------- warned once

def test_natural_clients_without_test_data_of_their_own_are_one_warning_and_the_run_goes_on(tmp_path):
    # The test files hold other writers than the training files: no client kept has test rows.
    root = tmp_path / "leaf"

    def others(data, folder):
        data["users"] = ["w3", "w4"]
        data["user_data"] = {"w3": data["user_data"]["w1"], "w4": data["user_data"]["w2"]}
    write_leaf(root, others, split="test")
    warning = "partition=natural: none of the 2 clients kept has test examples of its own"
    runs = [tmp_path / "run_others", tmp_path / "run_own"]
    two_rounds = [a for a in RUN if not a.startswith("hyperparams.rounds=")] + ["hyperparams.rounds=2"]
    roots = [root, write_leaf(tmp_path / "own")]
    cases = [(["dataset=femnist", f"dataset.load.root={leaf}", "hyperparams.num_clients=2", *two_rounds,
               f"hydra.run.dir={run}"], [], {}) for leaf, run in zip(roots, runs)]
    others_run, own_run = run_catalogue(cases, tmp_path / "work")
    assert others_run["code"] == 0, others_run["stderr"][-2000:]
    shown = [line for line in others_run["stderr"].splitlines() if warning in line]
    assert len(shown) == 1 and "[WARNING]" in shown[0], others_run["stderr"][-2000:]  # once, on one line
    assert (runs[0] / "fedrun.log").read_text().count(warning) == 1  # and in the run's log
    assert "own_test_acc/own_test_loss and rounds.csv's client_acc_mean/_std/_worst10 stay empty" in shown[0]
    clients, rounds = pd.read_csv(runs[0] / "clients.csv"), pd.read_csv(runs[0] / "rounds.csv")
    assert len(clients) == 4 and clients["own_test_acc"].isna().all()  # 2 clients x 2 rounds
    assert len(rounds) == 2 and rounds["client_acc_mean"].isna().all() and rounds["test_acc"].notna().all()
    # Writers with test data of their own: no warning, their columns filled.
    assert own_run["code"] == 0 and "WARNING" not in own_run["stderr"], own_run["stderr"][-2000:]
    assert pd.read_csv(runs[1] / "clients.csv")["own_test_acc"].notna().all()


def test_the_warning_is_one_note_of_the_run_when_no_client_has_test_rows():
    from types import SimpleNamespace

    from fedrun.harness.federated_run import Federation, _client_tests

    parts = [np.array([0, 1]), np.array([2])]  # clients 0 and 1; the test split holds only client 2's
    data = SimpleNamespace(train_groups=np.array([0, 0, 1]), test_groups=np.array([2, 2]))  # what it reads
    tests, every, notes = _client_tests(parts, data, Federation(), "cpu")
    assert [len(t) for t in tests] == [0, 0] and [n[:74] for n in notes] == [
        "partition=natural: none of the 2 clients kept has test examples of its own"]
    data.test_groups = np.array([1, 2])  # client 1 has a test row: no note
    assert _client_tests(parts, data, Federation(), "cpu")[2] == ()
