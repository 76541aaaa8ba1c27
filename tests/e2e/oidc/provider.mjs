// An OpenID Provider for the console's sign-in test: panva's oidc-provider (an OpenID
// Certified implementation, pinned in package.json), with its development login and consent
// pages (any login name, any password: the name becomes the `sub`). Started by
// tests/e2e/test_console_oidc.py on a loopback port; prints "ready <issuer>" when listening.
//
//   node provider.mjs PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI
import Provider from "oidc-provider";

const [port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: clientId,
      client_secret: clientSecret,
      redirect_uris: [redirectUri],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  // The account is whoever signed in; its only claim is its subject.
  findAccount: async (_ctx, sub) => ({ accountId: sub, claims: async () => ({ sub }) }),
  cookies: { keys: ["agentrt-console-test"] },
  features: { devInteractions: { enabled: true } },
});
// Its warnings about development keys and pages are for this test's provider, as intended.
provider.on("server_error", (_ctx, error) => console.error("server_error", error));
provider.listen(Number(port), "127.0.0.1", () => console.log(`ready ${issuer}`));
