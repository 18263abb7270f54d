"""A ConfigMap volume as the kubelet writes it, for tests of what reads one: each key a link `<key>` →
`..data/<key>`, and each update a new `..<timestamp>` directory that a `..data_tmp` link to it, renamed over
`..data`, swaps in at once (the kubelet's atomic writer)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path


class ConfigMapVolume:
    """The volume of a ConfigMap whose `data` is first `data`, in `root`; `update` writes the next version."""

    def __init__(self, root: Path, data: Mapping[str, str]) -> None:
        self.root = root
        self.versions = 0
        self.update(data)

    def update(self, data: Mapping[str, str]) -> None:
        """Swap in a version holding `data`, then link the keys added and unlink those gone, as the kubelet does."""
        self.versions += 1
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        stamp = self.root / f"..2026_11_28_09_00_{self.versions:02d}.000000001"
        stamp.mkdir()
        for key, value in data.items():
            (stamp / key).write_text(value)
        (self.root / "..data_tmp").symlink_to(stamp.name)
        os.rename(self.root / "..data_tmp", self.root / "..data")
        for link in self.root.iterdir():
            if not link.name.startswith(".") and link.name not in data:
                link.unlink()
        for key in data:
            if not (self.root / key).is_symlink():
                (self.root / key).symlink_to(f"..data/{key}")
        if old is not None:
            shutil.rmtree(self.root / old)
