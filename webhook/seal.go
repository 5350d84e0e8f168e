package webhook

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// Redacted stands for a secret value in what Get and List return: signing
// secrets and secret header values never leave the library after Create
// (and RotateSecret) returned them.
const Redacted = "[redacted]"

// Key seals endpoint secrets at rest with AES-256-GCM (see Config.Keys).
// Its String, GoString, MarshalJSON and LogValue print the ID only.
type Key struct {
	// ID is stored with every value the key seals, so that the right key
	// opens it after a rotation: 1 to 64 letters, digits, '-', '_' or '.'.
	ID string
	// Key is 32 random bytes. Keep it out of the database it protects.
	Key []byte
}

// String prints the key's ID, never its bytes.
func (k Key) String() string { return "webhook.Key{ID: " + k.ID + ", Key: " + Redacted + "}" }

// GoString prints the key's ID, never its bytes.
func (k Key) GoString() string { return k.String() }

// MarshalJSON writes the key's ID, never its bytes: a Config logged by
// slog's JSON handler, or dumped, shows no key.
func (k Key) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct{ ID, Key string }{k.ID, Redacted})
}

// LogValue logs the key's ID, never its bytes.
func (k Key) LogValue() slog.Value { return slog.GroupValue(slog.String("id", k.ID)) }

// ErrNoKeys is returned by Create, Update and RotateSecret when there is a
// secret to store and neither Config.Keys nor Config.PlainSecrets says how.
var ErrNoKeys = errors.New("webhook: no Config.Keys to seal secrets with (or set Config.PlainSecrets to store them in clear)")

// ErrUnsealing is returned when a sealed secret cannot be opened: the key
// that sealed it is not in Config.Keys, or its bytes are not those that
// sealed it (or the ciphertext was altered). A delivery that meets it sends
// nothing and logs an attempt of error class "secret".
var ErrUnsealing = errors.New("webhook: cannot open a sealed secret")

// stored is a secret value as the database keeps it: sealed (KeyID and
// Sealed, the base64 of nonce and ciphertext) or, with Config.PlainSecrets
// and no keys, in clear (Plain, under the name "secret" of the first
// schema's rows).
type stored struct {
	KeyID     string    `json:"key_id,omitempty"`
	Sealed    string    `json:"sealed,omitempty"`
	Plain     string    `json:"secret,omitempty"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// keyring holds Config.Keys ready to use; primary seals, all open.
type keyring struct {
	primary string
	aeads   map[string]cipher.AEAD
	plain   bool // Config.PlainSecrets
}

func newKeyring(keys []Key, plain bool) (keyring, error) {
	k := keyring{aeads: map[string]cipher.AEAD{}, plain: plain}
	for i, key := range keys {
		if !validKeyID(key.ID) {
			return keyring{}, invalidConfig(fmt.Sprintf("Keys[%d].ID", i), "%q: 1 to 64 letters, digits, '-', '_' or '.'", key.ID)
		}
		if _, dup := k.aeads[key.ID]; dup {
			return keyring{}, invalidConfig(fmt.Sprintf("Keys[%d].ID", i), "%q is given twice", key.ID)
		}
		if len(key.Key) != 32 {
			return keyring{}, invalidConfig(fmt.Sprintf("Keys[%d].Key", i), "(%s): %d bytes; AES-256 needs 32", key.ID, len(key.Key))
		}
		block, err := aes.NewCipher(key.Key)
		if err != nil {
			return keyring{}, fmt.Errorf("webhook: Keys[%d] (%s): %w", i, key.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return keyring{}, fmt.Errorf("webhook: Keys[%d] (%s): %w", i, key.ID, err)
		}
		k.aeads[key.ID] = aead
		if i == 0 {
			k.primary = key.ID
		}
	}
	return k, nil
}

func validKeyID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		allowed := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.'
		if !allowed {
			return false
		}
	}
	return true
}

// aad binds a sealed value to its endpoint and its place in it, so that a
// ciphertext copied to another row or field does not open there.
func aad(endpoint uuid.UUID, field string) []byte {
	return []byte("standmeet-events/webhook\x00" + endpoint.String() + "\x00" + field)
}

// seal stores value under the primary key, or in clear when the host opted
// in and gave no key.
func (k keyring) seal(endpoint uuid.UUID, field, value string) (stored, error) {
	if k.primary == "" {
		if !k.plain {
			return stored{}, ErrNoKeys
		}
		return stored{Plain: value}, nil
	}
	aead := k.aeads[k.primary]
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(value)+aead.Overhead())
	_, _ = rand.Read(nonce) // crypto/rand never fails on supported platforms
	sealed := aead.Seal(nonce, nonce, []byte(value), aad(endpoint, field))
	return stored{KeyID: k.primary, Sealed: base64.StdEncoding.EncodeToString(sealed)}, nil
}

// open returns a stored value in clear.
func (k keyring) open(endpoint uuid.UUID, field string, s stored) (string, error) {
	if s.KeyID == "" {
		return s.Plain, nil
	}
	aead, ok := k.aeads[s.KeyID]
	if !ok {
		return "", fmt.Errorf("%w: endpoint %s: %s was sealed with key %q, which is not in Config.Keys", ErrUnsealing, endpoint, field, s.KeyID)
	}
	b, err := base64.StdEncoding.DecodeString(s.Sealed)
	if err == nil && len(b) >= aead.NonceSize() {
		var plain []byte
		if plain, err = aead.Open(nil, b[:aead.NonceSize()], b[aead.NonceSize():], aad(endpoint, field)); err == nil {
			return string(plain), nil
		}
	}
	return "", fmt.Errorf("%w: endpoint %s: %s does not open with key %q: not the bytes that sealed it, or the value was altered",
		ErrUnsealing, endpoint, field, s.KeyID)
}

// current reports whether s is sealed under the primary key, or needs no
// sealing because there is no key.
func (k keyring) current(s stored) bool { return s.KeyID == k.primary }

// Field names bound into the sealing (see aad).
const fieldSecret = "signing secret"

func fieldHeader(name string) string { return "header " + name }

// openSecrets returns the endpoint's signing secrets that sign at now, in
// clear. Only the delivery worker (and Reseal) open secrets.
func (w *Webhooks) openSecrets(ep *Endpoint, now time.Time) ([]string, error) {
	var out []string
	for _, s := range ep.sealed {
		if !s.ExpiresAt.IsZero() && !s.ExpiresAt.After(now) {
			continue
		}
		v, err := w.keys.open(ep.ID, fieldSecret, s)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// openHeaders returns the endpoint's secret headers in clear.
func (w *Webhooks) openHeaders(ep *Endpoint) (map[string]string, error) {
	out := make(map[string]string, len(ep.sealedHeaders))
	for name, s := range ep.sealedHeaders {
		v, err := w.keys.open(ep.ID, fieldHeader(name), s)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// ResealBatch is how many endpoints one transaction of Reseal re-seals.
const ResealBatch = 100

// Reseal seals again, under the primary key (the first of Config.Keys),
// every endpoint secret and secret header sealed under another key or
// stored in clear, ResealBatch endpoints per transaction, and returns how
// many endpoints it changed. Run it after putting a new key first in
// Config.Keys (every process must know the new key before it seals with
// it: deploy the new key second, then first); once it returns with no
// error, the old key may leave Config.Keys. The periodic job of
// PeriodicJobs runs it every hour. Endpoints it cannot open are left as
// they are and reported in the error (wrapping ErrUnsealing); the others
// are re-sealed all the same.
func (w *Webhooks) Reseal(ctx context.Context) (int, error) {
	if w.keys.primary == "" {
		return 0, nil
	}
	var (
		total int
		after uuid.UUID
		errs  []error
	)
	for {
		n, last, more, err := w.resealBatch(ctx, after, &errs)
		total += n
		if err != nil {
			return total, err
		}
		if !more {
			return total, errors.Join(errs...)
		}
		after = last
	}
}

// resealBatch re-seals up to ResealBatch endpoints with IDs after after, in
// one transaction. It waits for rows that are locked (a delivery recording
// its outcome) rather than skip them: Reseal returning means every row was
// seen.
func (w *Webhooks) resealBatch(ctx context.Context, after uuid.UUID, errs *[]error) (n int, last uuid.UUID, more bool, err error) {
	err = pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, w.sql.ResealCandidates, after, w.keys.primary, ResealBatch)
		if err != nil {
			return err
		}
		type row struct {
			ID      uuid.UUID
			Secrets []stored
			Headers map[string]stored
		}
		batch, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			return err
		}
		more = len(batch) == ResealBatch
		for _, r := range batch {
			last = r.ID
			secrets, headers, err := w.resealRow(r.ID, r.Secrets, r.Headers)
			if err != nil {
				*errs = append(*errs, err)
				continue
			}
			if _, err := tx.Exec(ctx, w.sql.Reseal, r.ID, secrets, headers); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, last, false, fmt.Errorf("webhook: reseal: %w", err)
	}
	return n, last, more, nil
}

func (w *Webhooks) resealRow(id uuid.UUID, secrets []stored, headers map[string]stored) ([]stored, map[string]stored, error) {
	redo := func(field string, s stored) (stored, error) {
		if w.keys.current(s) {
			return s, nil
		}
		v, err := w.keys.open(id, field, s)
		if err != nil {
			return stored{}, err
		}
		out, err := w.keys.seal(id, field, v)
		out.ExpiresAt = s.ExpiresAt
		return out, err
	}
	outSecrets := make([]stored, len(secrets))
	for i, s := range secrets {
		var err error
		if outSecrets[i], err = redo(fieldSecret, s); err != nil {
			return nil, nil, err
		}
	}
	outHeaders := maps.Clone(headers)
	for name, s := range headers {
		var err error
		if outHeaders[name], err = redo(fieldHeader(name), s); err != nil {
			return nil, nil, err
		}
	}
	return outSecrets, outHeaders, nil
}

// ResealArgs are the args of the periodic "webhook.reseal" job.
type ResealArgs struct{}

// Kind is "webhook.reseal".
func (ResealArgs) Kind() string { return "webhook.reseal" }

type resealWorker struct {
	river.WorkerDefaults[ResealArgs]
	w *Webhooks
}

func (r *resealWorker) Work(ctx context.Context, _ *river.Job[ResealArgs]) error {
	n, err := r.w.Reseal(ctx)
	if n > 0 {
		r.w.config.Logger.InfoContext(ctx, "webhook: re-sealed endpoint secrets", slog.Int("endpoints", n), slog.String("key_id", r.w.keys.primary))
	}
	return err
}
