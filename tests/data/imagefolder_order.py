"""Helper for test_class_order.c: prints the samples of the image folder argv[1] in the order
torchvision's ImageFolder (datasets/folder.py: find_classes, make_dataset) gives them, one
"<class>/<file>" line each, as raw bytes: classes are sorted(os.scandir names that are
directories), the files of each sorted() too; Python's sorted() on str is codepoint order,
so "Zebra" < "apple". Hidden entries are left out, as tandem documents."""
import os
import sys

EXTS = (".png", ".jpg", ".jpeg")

root = sys.argv[1]
classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
out = []
for c in classes:
    for f in sorted(os.listdir(os.path.join(root, c))):
        if not f.startswith(".") and f.lower().endswith(EXTS):
            out.append(c + "/" + f)
sys.stdout.buffer.write(b"".join(os.fsencode(s) + b"\n" for s in out))
