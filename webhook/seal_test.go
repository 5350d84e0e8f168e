package webhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/testdb"
)

// testKey derives a 32-byte key from a name, so tests can name keys.
func testKey(id string) Key {
	k := sha256.Sum256([]byte("test key " + id))
	return Key{ID: id, Key: k[:]}
}

// rawRow is the endpoint's row as a dump would show it.
func rawRow(t *testing.T, b *bundle, ep Endpoint) string {
	t.Helper()
	var row string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT t::text FROM webhook_endpoints t WHERE id = $1", ep.ID).Scan(&row))
	return row
}

// requireSealed fails if the row shows the secret or the header value in
// any form a reader could use.
func requireSealed(t *testing.T, row, secret, header string) {
	t.Helper()
	key := strings.TrimPrefix(secret, "whsec_")
	raw, err := base64.StdEncoding.DecodeString(key)
	require.NoError(t, err)
	for _, leak := range []string{secret, key, fmt.Sprintf("%x", raw), header, base64.StdEncoding.EncodeToString([]byte(header))} {
		require.NotContains(t, row, leak)
	}
	require.NotContains(t, row, "whsec_")
}

// Secrets and secret headers are sealed: the table shows neither, Get and
// List redact them, deliveries open them.
func TestSecretsAreSealedAtRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{Keys: []Key{testKey("k1")}})
	type got struct {
		verified error
		auth     string
	}
	received := make(chan got, 10)
	var secret string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received <- got{Verify(secret, r.Header, body), r.Header.Get("Authorization")}
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}, Headers: map[string]string{"X-Tenant": "acme"},
		SecretHeaders: map[string]string{"authorization": "Bearer tok-123"}})
	require.NoError(t, err)
	secret = ep.Secrets[0].Secret
	require.True(t, strings.HasPrefix(secret, "whsec_"), "Create hands the secret over once")
	require.Equal(t, "k1", ep.Secrets[0].KeyID)
	requireSealed(t, rawRow(t, b, ep), secret, "tok-123")
	require.Contains(t, rawRow(t, b, ep), "acme", "plain headers stay plain")

	for _, e := range []Endpoint{must(b.wh.Get(ctx, ep.ID)), must(b.wh.List(ctx, [16]byte{}, 10)).Endpoints[0]} {
		require.Equal(t, Redacted, e.Secrets[0].Secret)
		require.Equal(t, map[string]string{"Authorization": Redacted}, e.SecretHeaders)
		require.Equal(t, map[string]string{"X-Tenant": "acme"}, e.Headers)
	}

	b.record(t, events.Event{Type: "a"})
	r := <-received
	require.NoError(t, r.verified)
	require.Equal(t, "Bearer tok-123", r.auth)

	// Update keeps a secret header given as Redacted, and replaces others.
	_, err = b.wh.Update(ctx, ep.ID, EndpointParams{URL: srv.URL, Types: []string{"**"}, SecretHeaders: map[string]string{"Authorization": Redacted}})
	require.NoError(t, err)
	next, err := b.wh.RotateSecret(ctx, ep.ID, time.Hour)
	require.NoError(t, err)
	requireSealed(t, rawRow(t, b, ep), next, "tok-123")
	b.record(t, events.Event{Type: "a"})
	r = <-received
	require.NoError(t, r.verified, "the old secret still signs")
	require.Equal(t, "Bearer tok-123", r.auth)
	_, err = b.wh.Update(ctx, ep.ID, EndpointParams{URL: srv.URL, Types: []string{"**"}, SecretHeaders: map[string]string{"X-Other": Redacted}})
	require.ErrorIs(t, err, ErrInvalidEndpoint, "nothing stored to keep")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Without keys, secrets are stored only if the host says so.
func TestNoKeysRefusesToStoreSecrets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t)
	wh, err := New(pool, &Config{})
	require.NoError(t, err)
	_, err = wh.Create(ctx, EndpointParams{URL: "https://example.com/", Types: []string{"**"}})
	require.ErrorIs(t, err, ErrNoKeys)

	plain, err := New(pool, &Config{PlainSecrets: true})
	require.NoError(t, err)
	ep, err := plain.Create(ctx, EndpointParams{URL: "https://example.com/", Types: []string{"**"}})
	require.NoError(t, err)
	require.Empty(t, ep.Secrets[0].KeyID)
	_, err = wh.RotateSecret(ctx, ep.ID, 0)
	require.ErrorIs(t, err, ErrNoKeys)

	for _, bad := range [][]Key{{{ID: "k", Key: make([]byte, 16)}}, {{ID: "", Key: make([]byte, 32)}}, {testKey("a"), testKey("a")}, {{ID: "has space", Key: make([]byte, 32)}}} {
		_, err := New(pool, &Config{Keys: bad})
		require.Error(t, err)
	}
	require.NotContains(t, fmt.Sprintf("%v %+v %#v", testKey("a"), testKey("a"), testKey("a")), string(testKey("a").Key))
}

// Rotation: a new key first, Reseal, the old key dropped; deliveries verify
// throughout, and a process with the wrong key fails clearly.
func TestKeyRotationReseals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{Keys: []Key{testKey("k1")}})
	received := make(chan error, 10)
	var secret string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := Verify(secret, r.Header, body)
		if err == nil && r.Header.Get("Authorization") != "Bearer tok-123" {
			err = fmt.Errorf("authorization %q", r.Header.Get("Authorization"))
		}
		received <- err
	}))
	defer srv.Close()
	ep, err := b.wh.Create(ctx, EndpointParams{URL: srv.URL, Types: []string{"**"}, SecretHeaders: map[string]string{"Authorization": "Bearer tok-123"}})
	require.NoError(t, err)
	secret = ep.Secrets[0].Secret
	delivered := func(why string) {
		t.Helper()
		b.record(t, events.Event{Type: "a"})
		select {
		case err := <-received:
			require.NoError(t, err, why)
		case <-time.After(20 * time.Second):
			t.Fatal("no delivery: " + why)
		}
	}
	delivered("sealed with k1")
	keyIDs := func() string {
		var ids string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT string_agg(DISTINCT v->>'key_id', ',') FROM webhook_endpoints,
			LATERAL (SELECT value FROM jsonb_array_elements(secrets) UNION ALL SELECT value FROM jsonb_each(secret_headers)) AS x(v)
			WHERE id = $1`, ep.ID).Scan(&ids))
		return ids
	}
	require.Equal(t, "k1", keyIDs())

	// Every process learns k2, and it becomes the primary.
	b.start(t, &Config{Keys: []Key{testKey("k2"), testKey("k1")}})
	delivered("k1 still opens what it sealed")
	n, err := b.wh.Reseal(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "k2", keyIDs())
	requireSealed(t, rawRow(t, b, ep), secret, "tok-123")
	n, err = b.wh.Reseal(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to re-seal")

	// k1 is gone.
	b.start(t, &Config{Keys: []Key{testKey("k2")}})
	delivered("re-sealed with k2")

	// A process without k2 fails clearly, and sends nothing.
	b.start(t, &Config{Keys: []Key{testKey("k1")}})
	e := b.record(t, events.Event{Type: "a"})[0]
	var a Attempt
	require.Eventually(t, func() bool {
		all, err := b.wh.Attempts(ctx, AttemptFilter{EventID: e.ID})
		require.NoError(t, err)
		if len(all) > 0 {
			a = all[0]
		}
		return len(all) > 0
	}, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, "secret", a.ErrorClass)
	require.Contains(t, a.Error, `sealed with key "k2", which is not in Config.Keys`)
	_, err = b.wh.Reseal(ctx)
	require.ErrorIs(t, err, ErrUnsealing)

	// A key under the right ID but other bytes: refused, not misread.
	wrong := Key{ID: "k2", Key: testKey("k1").Key}
	wh, err := New(b.pool, &Config{Keys: []Key{wrong}})
	require.NoError(t, err)
	got, err := wh.getForDelivery(ctx, ep.ID) // opens nothing
	require.NoError(t, err)
	_, err = wh.openSecrets(&got, time.Now())
	require.ErrorIs(t, err, ErrUnsealing)
	require.Contains(t, err.Error(), `does not open with key "k2"`)
	require.Len(t, received, 0, "nothing was sent without its secret")
}

// Copying one endpoint's sealed secret into another's row does not let
// the other sign with it.
func TestSealedValueIsBoundToItsEndpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, &Config{Keys: []Key{testKey("k1")}})
	a, err := b.wh.Create(ctx, EndpointParams{URL: "https://a.example/", Types: []string{"**"}})
	require.NoError(t, err)
	other, err := b.wh.Create(ctx, EndpointParams{URL: "https://b.example/", Types: []string{"**"}})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE webhook_endpoints SET secrets = (SELECT secrets FROM webhook_endpoints WHERE id = $1) WHERE id = $2", a.ID, other.ID)
	require.NoError(t, err)
	got, err := b.wh.getForDelivery(ctx, other.ID)
	require.NoError(t, err)
	_, err = b.wh.openSecrets(&got, time.Now())
	require.ErrorIs(t, err, ErrUnsealing)
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
