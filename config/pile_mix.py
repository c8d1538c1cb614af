# The Pile mixed as its authors mixed it: each component seen the number of epochs of Table 1 of Gao et al. 2020
# (arXiv 2101.00027), as data_mix `repeat` weights, over the component folders under PILE_MIX_DATA
# (prepare_data.py --by-subset writes OUT/<name>/ per component; to_mds.py one MDS root per component).
#   python -m pilegpt.launch -n 8 train.py config/pile_mix.py
#   PILE_MIX_DATA=s3://bucket/pile-mds python -m pilegpt.launch -n 8 train.py config/pile_mix.py  (MDS roots on S3)
# A folder is matched to a component by its name: prepare_data's (pilegpt.data.subset_folder: "pile-cc",
# "gutenberg_pg-19"), or else its letters and digits, case ignored ("PileCC" -> Pile-CC). Components absent from
# the folder are left out: with repeat weights the others keep their epochs, so their shares of an epoch grow in
# proportion (renormalised), and a line names the absent ones; two folders of one component are an error
# (pilegpt.train.data.mix.repeat_mix_of_folders). monology/pile-uncopyrighted (prepare_data's default mirror) has no
# Books3, BookCorpus2, OpenSubtitles or YoutubeSubtitles (docs/training.md#mixing-components).
import os

from pilegpt.train.data.mix import repeat_mix_of_folders

base = "pile.py"  # the model, batch and schedule of GPT-2 124M on the Pile

_PILE_EPOCHS = {  # Table 1, "Epochs"
    "Pile-CC": 1.0, "PubMed Central": 2.0, "Books3": 1.5, "OpenWebText2": 2.0, "ArXiv": 2.0, "Github": 1.0,
    "FreeLaw": 1.5, "StackExchange": 2.0, "USPTO Backgrounds": 2.0, "PubMed Abstracts": 2.0,
    "Gutenberg (PG-19)": 2.5, "OpenSubtitles": 1.5, "Wikipedia (en)": 3.0, "DM Mathematics": 2.0, "Ubuntu IRC": 2.0,
    "BookCorpus2": 1.5, "EuroParl": 2.0, "HackerNews": 2.0, "YoutubeSubtitles": 2.0, "PhilPapers": 2.0,
    "NIH ExPorter": 2.0, "Enron Emails": 2.0,
}

data_dir = data_remote = None  # data_mix names the data
run_name = os.environ.get("RUN_NAME", "pile-mix-gpt2-124m")
data_mix = repeat_mix_of_folders(os.environ.get("PILE_MIX_DATA", "data/pile_by_subset"), _PILE_EPOCHS)
