// Images going with the next message: pasted into the message box, dropped on the composer, or
// chosen with the file button. Each is read as base64 for the chat request's `images` (docs/api.md
// "Images"); the gateway checks kind and size and answers a refusal the console shows as is.

import { clear, h } from "./dom.js";

const KINDS = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);

export class ImageTray {
  constructor({ tray, input, message, composer, status }) {
    this.el = { tray, input, status };
    this.images = []; // { name, type, data (base64), url (data URL, for the thumbnail) }
    input.addEventListener("change", () => {
      this.add(input.files);
      input.value = "";
    });
    message.addEventListener("paste", (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (files.length) {
        event.preventDefault(); // a pasted screenshot is the image, not its file name as text
        this.add(files);
      }
    });
    composer.addEventListener("dragover", (event) => event.preventDefault());
    composer.addEventListener("drop", (event) => {
      event.preventDefault();
      this.add(event.dataTransfer?.files || []);
    });
  }

  get count() {
    return this.images.length;
  }

  async add(files) {
    for (const file of files) {
      if (!KINDS.has(file.type)) {
        this.el.status.textContent = `${file.name || "that file"} is not a PNG, JPEG, GIF or WebP image`;
        continue;
      }
      const url = await dataUrl(file);
      this.images.push({ name: file.name || "pasted image", type: file.type, data: url.split(",", 2)[1] || "", url });
      this.el.status.textContent = "";
    }
    this.render();
  }

  // The images for the request (and their thumbnails for the user's bubble); the tray empties.
  take() {
    const taken = this.images;
    this.images = [];
    this.render();
    return taken;
  }

  render() {
    clear(this.el.tray);
    this.el.tray.hidden = this.images.length === 0;
    this.images.forEach((image, index) => {
      this.el.tray.append(h("li", { class: "attachment" },
        h("img", { src: image.url, alt: image.name, class: "thumb" }),
        h("span", { class: "small" }, image.name),
        h("button", { type: "button", class: "link", "aria-label": `Remove ${image.name}`, onclick: () => {
          this.images.splice(index, 1);
          this.render();
        } }, "×")));
    });
  }
}

// Thumbnails of a message's images: the ones just sent (with their bytes), or a stored message's
// (its references only: named, not fetched).
export function imageStrip(images) {
  if (!images || !images.length) return null;
  return h("div", { class: "images" }, images.map((image) => image.url
    ? h("img", { src: image.url, alt: image.name, class: "thumb" })
    : h("span", { class: "image-ref small muted" }, `[image: ${image.name || image.path}]`)));
}

function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
