"""Writing a matplotlib figure: the one place that lays it out, saves it (parent folders created) and frees it."""
from __future__ import annotations

from pathlib import Path


def save_figure(fig, path: Path | str, dpi: int = 100) -> Path:
    """tight_layout, save to ``path`` (PNG by its suffix), close the figure (pyplot keeps open ones alive)."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
