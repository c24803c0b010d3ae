"""Page bookkeeping for the paged KV cache: plain Python, no tensors, so the scheduler can use it."""

from __future__ import annotations


class OutOfPagesError(RuntimeError):
    pass


class PageAllocator:
    """Free list over `num_pages` pages of `page_size` token slots each."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"num_pages and page_size must be positive, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low page ids first
        self.peak_in_use = 0  # most pages ever held at once since creation or reset_peak()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        if num_pages > len(self._free):
            raise OutOfPagesError(f"asked for {num_pages} KV pages, {len(self._free)} free of {self.num_pages}")
        pages = [self._free.pop() for _ in range(num_pages)]
        self.peak_in_use = max(self.peak_in_use, self.num_in_use)
        return pages

    @property
    def num_in_use(self) -> int:
        return self.num_pages - len(self._free)

    def reset_peak(self) -> None:
        """Start a new peak measurement from the pages in use now."""
        self.peak_in_use = self.num_in_use

    def grow(self, page_table: list[int], num_tokens: int) -> None:
        """Append pages to `page_table` until it holds `num_tokens` tokens."""
        missing = self.pages_for(num_tokens) - len(page_table)
        if missing > 0:
            page_table.extend(self.allocate(missing))

    def free(self, page_table: list[int]) -> None:
        self._free.extend(reversed(page_table))
        page_table.clear()
