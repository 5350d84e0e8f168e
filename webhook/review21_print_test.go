package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// What Get, List and Update return prints no secret, however a host logs
// it: the unexported copy of the row an Endpoint carries held the secrets
// stored in clear (Config.PlainSecrets, rows from 0.1.0 not yet re-sealed),
// and %+v, %#v and slog's text handler print unexported fields.
func TestReturnedEndpointPrintsNoSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{PlainSecrets: true})
	const header = "Bearer hunter2-header"
	ep, err := b.wh.Create(ctx, EndpointParams{URL: "http://127.0.0.1:1/", Types: []string{"**"},
		SecretHeaders: map[string]string{"Authorization": header}})
	require.NoError(t, err)
	secret := ep.Secrets[0].Secret
	got, err := b.wh.Get(ctx, ep.ID)
	require.NoError(t, err)
	list, err := b.wh.List(ctx, [16]byte{}, 10)
	require.NoError(t, err)
	updated, err := b.wh.Update(ctx, ep.ID, EndpointParams{URL: "http://127.0.0.1:2/", Types: []string{"**"}})
	require.NoError(t, err)
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("endpoint", "got", got)
	for name, e := range map[string]Endpoint{"Get": got, "List": list.Endpoints[0], "Update": updated} {
		for _, s := range []string{fmt.Sprintf("%v", e), fmt.Sprintf("%+v", e), fmt.Sprintf("%#v", e), logged.String()} {
			require.NotContains(t, s, secret, "%s", name)
			require.NotContains(t, s, header, "%s", name)
		}
	}
}

// A Key's bytes do not leave through JSON (a host logging its Config with
// slog's JSON handler, or dumping it).
func TestKeyBytesDoNotLeak(t *testing.T) {
	k := testKey("k1")
	cfg := Config{Keys: []Key{k}}
	raw := base64.StdEncoding.EncodeToString(k.Key)
	j, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.NotContains(t, string(j), raw, "json.Marshal(Config)")
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("config", "webhook", cfg)
	require.NotContains(t, logged.String(), raw, "slog JSON handler")
}
