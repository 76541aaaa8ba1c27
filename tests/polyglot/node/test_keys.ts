// Keys the tests make for themselves, to sign notes no trusted key signed.
import { generateKeyPairSync, sign } from "node:crypto";
import { ed25519KeyId, hex } from "./tlog.js";

/** A fresh Ed25519 key named `name`: its verifier key and a signer of note texts. */
export function newKey(name: string): { vkey: string; sign: (text: string) => string } {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const raw = new Uint8Array(Buffer.from(publicKey.export({ format: "jwk" }).x as string, "base64url"));
  const id = ed25519KeyId(name, raw);
  const vkey = `${name}+${hex(id)}+${Buffer.from([0x01, ...raw]).toString("base64")}`;
  return {
    vkey,
    sign: (text) => {
      const signature = sign(null, Buffer.from(text, "utf8"), privateKey);
      return `${text}\n— ${name} ${Buffer.concat([id, signature]).toString("base64")}\n`;
    },
  };
}
