"""Display for the example pages: figures, Markdown, source code, tables and tensor shapes.

Every `examples/*.py` runs two ways: executed in a Jupyter kernel into a documentation page
(mkdocs-jupyter), and as a plain script. Each helper here renders rich output under IPython (an
image, Markdown) and prints plain text otherwise, so one script serves both. IPython is optional
and imported only inside the functions, as are matplotlib (through `attention.plotting`) and torch:
`import attention.display` needs neither.
"""

import inspect
import textwrap


def show(fig, alt=None):
    """Display a figure in a notebook as an image; do nothing outside IPython (a plain script).

    The output is an HTML `<img>` (see `attention.plotting.figure_html`), with a `text/plain`
    fallback that names the figure, so it renders as an image in Jupyter, in nbconvert and in
    mkdocs-jupyter pages alike, independent of the matplotlib backend. Returns None, so a
    `show(...)` that ends a cell prints nothing else.

    Args:
        fig: a `matplotlib.figure.Figure`.
        alt: alt text; defaults to the figure's titles (`attention.plotting.figure_alt`).
    """
    display = _ipython_display()
    if display is None:
        return
    from attention.plotting import figure_alt, figure_html

    alt = figure_alt(fig) if alt is None else alt
    display({"text/html": figure_html(fig, alt), "text/plain": f"[figure: {alt}]"}, raw=True)


def show_markdown(text):
    """Show Markdown: rendered in a notebook, printed as it is in a plain script.

    Args:
        text: Markdown source.
    """
    _markdown_or_print(text, text)


def show_source(obj):
    """Show the source of a class or function, read from the installed package.

    Headed by a comment naming its file and qualified name; a highlighted Python block in a
    notebook, printed in a plain script. Read at run time, a page cannot drift from the code it shows.

    Args:
        obj: a class, function or method.
    """
    where = f"# {obj.__module__.replace('.', '/')}.py: {obj.__qualname__}\n"
    source = where + textwrap.dedent(inspect.getsource(obj))
    _markdown_or_print(f"```python\n{source}```", source)


def show_table(title, header, rows):
    """Show a table: a Markdown table under a bold title in a notebook, aligned columns in a plain script.

    Args:
        title: one line above the table.
        header: the column names.
        rows: one sequence of cells per row, each as long as `header`; cells are formatted with `str`
            (Markdown such as backticks renders in a notebook only).
    """
    rows = [[str(cell) for cell in row] for row in (header, *rows)]  # the header first
    cells = [[_table_cell(cell) for cell in row] for row in rows]
    markdown = [f"**{title}**", "", "| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(header)]
    markdown += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    widths = [max(len(cell) for cell in column) for column in zip(*rows)]
    plain = [title] + ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    _markdown_or_print("\n".join(markdown), "\n".join(plain))


def _table_cell(text):
    """A Markdown table cell: `|` escaped outside code spans (inside them the table parser leaves it be)."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def show_shape(label, tensor, letters):
    """Print one step of a shape walk-through: the label on its own line, then the tensor's shape and its shape in
    letters, indented, in columns of fixed width:

        q = query(x).view(B, T, H, D).transpose(1, 2)
            (2, 2, 4, 2)     (B, H, T, D)

    The label (often a long expression) has a line to itself, so on a phone, where a line wider than the screen
    scrolls sideways, neither the label nor the shapes lie off-screen; the shapes of consecutive steps stay
    aligned. Plain text in a notebook too: the lines printed by one cell form one aligned, monospaced block, where
    a rich output per line would break them into separate blocks.

    Args:
        label: the expression or name.
        tensor: anything with a `.shape` (a tensor, a FlexAttention `BlockMask`).
        letters: the shape in the notation of the docs, e.g. `"(B, H, T, D)"`.
    """
    # A shape column of 16 holds a 5-D shape such as (2, 4, 3, 2, 2); a longer one pushes the letters.
    print(f"{label}\n    {str(tuple(tensor.shape)):<16} {letters}")


def _ipython_display():
    """IPython's `display` when running under IPython (a notebook kernel), else None."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # IPython is optional: plain scripts run without it
        return None
    return display if get_ipython() is not None else None


def _markdown_or_print(markdown, plain):
    """Display `markdown` rendered under IPython; print `plain` elsewhere."""
    display = _ipython_display()
    if display is None:
        print(plain)
        return
    from IPython.display import Markdown

    display(Markdown(markdown))
