"""Reading the report back: elements with their attributes, and tables as rows of cell text."""

from html.parser import HTMLParser


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def parse(text: str) -> _Collector:
    c = _Collector()
    c.feed(text)
    c.close()
    return c


def table_with_header(doc: _Collector, first: str) -> list[dict]:
    """Rows (as header -> cell dicts) of the first table whose first header cell is ``first``."""
    for t in doc.tables:
        if t and t[0] and t[0][0] == first:
            return [dict(zip(t[0], row, strict=True)) for row in t[1:]]
    raise AssertionError(f"no table with first column {first!r}; tables: {[t[0] for t in doc.tables if t]}")


def elements(doc: _Collector, tag: str, **attrs) -> list[dict]:
    return [a for t, a in doc.elements if t == tag and all(a.get(k) == v for k, v in attrs.items())]
