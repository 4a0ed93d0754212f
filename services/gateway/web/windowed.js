// A long conversation as a window over it: only the entries in view (and a screen's worth on
// either side) are in the page; spacers above and below stand for the rest, at the heights the
// entries had when last shown (an estimate until then). So a 5,000-message session opens and
// scrolls as fast as a short one: the page holds a few dozen entries, whatever the length.

const ESTIMATE_PX = 96; // an entry's height before it was ever shown
const OVERSCAN_PX = 800; // rendered beyond the visible area, above and below

export class WindowedList {
  // render(index) -> the entry's element (made afresh or kept: the list keeps what it made).
  constructor(scroller, count, render) {
    this.scroller = scroller;
    this.count = count;
    this.render = render;
    this.heights = new Float64Array(count).fill(ESTIMATE_PX);
    this.made = new Map();
    this.first = 0;
    this.last = -1;
    this.top = document.createElement("div");
    this.bottom = document.createElement("div");
    this.top.className = this.bottom.className = "window-spacer";
    this.top.setAttribute("aria-hidden", "true");
    this.bottom.setAttribute("aria-hidden", "true");
    this.scroller.append(this.top, this.bottom);
    this.pending = false;
    this.onScroll = () => {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        // At the end, it stays at the end while newly measured entries change the heights.
        const atEnd = this.scroller.scrollTop + this.scroller.clientHeight >= this.scroller.scrollHeight - 2;
        if (this.update() && atEnd) this.scroller.scrollTop = this.scroller.scrollHeight;
      });
    };
    this.scroller.addEventListener("scroll", this.onScroll, { passive: true });
    // Home and End go to the very start and end: a smooth scroll's target, taken before the
    // entries on the way were measured, could stop short of it.
    this.onKey = (event) => {
      if (event.target !== this.scroller) return;
      if (event.key !== "End" && event.key !== "Home") {
        this.stopSettling();
        return;
      }
      event.preventDefault();
      if (event.key === "End") this.scrollToEnd();
      else this.scrollToIndex(0);
    };
    this.scroller.addEventListener("keydown", this.onKey);
    // A person scrolling takes over from the settling at the end.
    this.stopSettling = () => { this.settling = (this.settling || 0) + 1; };
    this.scroller.addEventListener("wheel", this.stopSettling, { passive: true });
    this.scroller.addEventListener("touchstart", this.stopSettling, { passive: true });
    this.gap = parseFloat(getComputedStyle(scroller).rowGap) || 0;
  }

  detach() {
    this.scroller.removeEventListener("scroll", this.onScroll);
    this.scroller.removeEventListener("keydown", this.onKey);
    this.scroller.removeEventListener("wheel", this.stopSettling);
    this.scroller.removeEventListener("touchstart", this.stopSettling);
  }

  #offsetOf(index) {
    let offset = 0;
    for (let i = 0; i < index; i += 1) offset += this.heights[i] + this.gap;
    return offset;
  }

  // Render the entries the scroll position shows; returns whether any height changed.
  update() {
    const view = this.scroller.clientHeight;
    const top = Math.max(0, this.scroller.scrollTop - this.#offsetOf(0) - OVERSCAN_PX);
    const bottom = this.scroller.scrollTop + view + OVERSCAN_PX;
    let first = 0;
    let offset = 0;
    while (first < this.count - 1 && offset + this.heights[first] + this.gap < top) {
      offset += this.heights[first] + this.gap;
      first += 1;
    }
    let last = first;
    let end = offset + this.heights[first];
    while (last < this.count - 1 && end < bottom) {
      last += 1;
      end += this.gap + this.heights[last];
    }
    return this.#show(first, last);
  }

  #show(first, last) {
    if (first !== this.first || last !== this.last) {
      // Entries that stay are left in place (a focused one keeps its focus); the rest go, and
      // the newly shown are put before and after them.
      for (let child = this.top.nextSibling; child && child !== this.bottom;) {
        const next = child.nextSibling;
        const index = Number(child.dataset.index);
        if (index < first || index > last) child.remove();
        child = next;
      }
      const element = (i) => {
        let made = this.made.get(i);
        if (!made) {
          made = this.render(i);
          made.dataset.index = String(i);
          this.made.set(i, made);
        }
        return made;
      };
      const kept = this.top.nextSibling !== this.bottom;
      const firstKept = kept ? Number(this.top.nextSibling.dataset.index) : last + 1;
      const lastKept = kept ? Number(this.bottom.previousSibling.dataset.index) : last;
      const before = [];
      for (let i = first; i < firstKept; i += 1) before.push(element(i));
      this.top.after(...before);
      const after = [];
      for (let i = lastKept + 1; i <= last; i += 1) after.push(element(i));
      this.bottom.before(...after);
      this.first = first;
      this.last = last;
    }
    let changed = false;
    for (let i = first; i <= last; i += 1) {
      const height = this.made.get(i).getBoundingClientRect().height;
      if (Math.abs(height - this.heights[i]) > 0.5) {
        this.heights[i] = height;
        changed = true;
      }
    }
    // A spacer is one flex item: it stands for the entries and the gaps between them.
    this.top.style.height = `${Math.max(0, this.#offsetOf(first) - this.gap)}px`;
    this.top.hidden = first === 0;
    let below = 0;
    for (let i = last + 1; i < this.count; i += 1) below += this.heights[i] + this.gap;
    this.bottom.style.height = `${Math.max(0, below - this.gap)}px`;
    this.bottom.hidden = last >= this.count - 1;
    return changed;
  }

  // To the end, as a conversation opens: heights measured on the way settle the position.
  scrollToEnd() {
    for (let round = 0; round < 10; round += 1) {
      this.scroller.scrollTop = this.scroller.scrollHeight;
      if (!this.update()) break;
    }
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.settling = (this.settling || 0) + 1;
    this.#settleAtEnd(30, this.settling);
  }

  // Frame after frame until nothing more is measured: layout after the first frame (fonts, the
  // scrollbar) can still change heights, and the end must stay the end.
  #settleAtEnd(frames, token) {
    requestAnimationFrame(() => {
      if (token !== this.settling) return; // another position was asked for meanwhile
      this.scroller.scrollTop = this.scroller.scrollHeight;
      if ((this.update() || this.last < this.count - 1) && frames > 0) this.#settleAtEnd(frames - 1, token);
      else this.scroller.scrollTop = this.scroller.scrollHeight;
    });
  }

  // Entry `index` into view; `then(element)` once it is in the page.
  scrollToIndex(index, then) {
    this.settling = (this.settling || 0) + 1;
    for (let round = 0; round < 10; round += 1) {
      this.scroller.scrollTop = this.#offsetOf(index);
      if (!this.update()) break;
    }
    const element = this.made.get(index);
    if (element && then) then(element);
  }
}
