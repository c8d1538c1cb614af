# The Pile mixed as its authors mixed it: each component seen the number of epochs of Table 1 of Gao et al. 2020
# (arXiv 2101.00027), as data_mix `repeat` weights, over the component folders under PILE_MIX_DATA
# (prepare_data.py --by-subset writes OUT/<name>/ per component; to_mds.py one MDS root per component).
#   python -m pilegpt.launch -n 8 train.py config/pile_mix.py
#   PILE_MIX_DATA=s3://bucket/pile-mds python -m pilegpt.launch -n 8 train.py config/pile_mix.py  (MDS roots on S3)
# A folder is matched to a component by its name: prepare_data's (pilegpt.data.subset_folder: "pile-cc",
# "gutenberg_pg-19"), or else its letters and digits, case ignored ("PileCC" -> Pile-CC). Components absent from
# the folder are left out: with repeat weights the others keep their epochs, so their shares of an epoch grow in
# proportion (renormalised), and the line below names the absent ones. monology/pile-uncopyrighted (prepare_data's
# default mirror) has no Books3, BookCorpus2, OpenSubtitles or YoutubeSubtitles (docs/training.md#mixing-components).
import os

base = "pile.py"  # the model, batch and schedule of GPT-2 124M on the Pile

_PILE_EPOCHS = {  # Table 1, "Epochs"
    "Pile-CC": 1.0, "PubMed Central": 2.0, "Books3": 1.5, "OpenWebText2": 2.0, "ArXiv": 2.0, "Github": 1.0,
    "FreeLaw": 1.5, "StackExchange": 2.0, "USPTO Backgrounds": 2.0, "PubMed Abstracts": 2.0,
    "Gutenberg (PG-19)": 2.5, "OpenSubtitles": 1.5, "Wikipedia (en)": 3.0, "DM Mathematics": 2.0, "Ubuntu IRC": 2.0,
    "BookCorpus2": 1.5, "EuroParl": 2.0, "HackerNews": 2.0, "YoutubeSubtitles": 2.0, "PhilPapers": 2.0,
    "NIH ExPorter": 2.0, "Enron Emails": 2.0,
}

_base_dir = os.environ.get("PILE_MIX_DATA", "data/pile_by_subset").rstrip("/")


def _key(name):
    return "".join(c for c in name.lower() if c.isalnum())


def _folders(base_dir):
    """The component folders under base_dir: local subfolders, or the prefixes under an s3:// URL."""
    from pilegpt import storage

    if not storage.is_remote(base_dir):
        if not os.path.isdir(base_dir):
            raise ValueError(f"PILE_MIX_DATA={base_dir} not found: prepare_data.py --by-subset --out-dir {base_dir}")
        return sorted(os.path.join(base_dir, n) for n in os.listdir(base_dir)
                      if os.path.isdir(os.path.join(base_dir, n)) and not n.startswith("."))
    folder = storage.folder(base_dir)
    return sorted({storage.join(base_dir, n.split("/", 1)[0]) for n in folder.names() if "/" in n})


def _component(folder):
    """The Pile component a folder holds, by its name; None if none."""
    from pilegpt.data import subset_folder

    name = folder.rstrip("/").rsplit("/", 1)[-1]
    by_folder = {subset_folder(n): n for n in _PILE_EPOCHS}
    return by_folder.get(name) or {_key(n): n for n in _PILE_EPOCHS}.get(_key(name))


_found = {}
for _folder in _folders(_base_dir):
    _name = _component(_folder)
    if _name is None:
        raise ValueError(f"{_folder} is not a Pile component (one of {', '.join(_PILE_EPOCHS)}): move it out of "
                         f"{_base_dir}")
    _found[_name] = _folder
if not _found:
    raise ValueError(f"no Pile component folder under PILE_MIX_DATA={_base_dir}: run prepare_data.py --by-subset")

data_dir = data_remote = None  # data_mix names the data
run_name = os.environ.get("RUN_NAME", "pile-mix-gpt2-124m")
data_mix = {_found[name]: {"repeat": epochs} for name, epochs in _PILE_EPOCHS.items() if name in _found}
_absent = [name for name in _PILE_EPOCHS if name not in _found]
if _absent and os.environ.get("RANK", "0") == "0":
    print(f"pile_mix: {len(_found)} of {len(_PILE_EPOCHS)} components under {_base_dir}; absent, left out (the "
          f"others' shares renormalised over what is present): {', '.join(_absent)}", flush=True)
