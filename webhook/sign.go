package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Standard Webhooks (https://www.standardwebhooks.com/), version 1: the
// headers of a delivery, and how a receiver checks them.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"

	// secretPrefix marks a secret in the Standard Webhooks form:
	// "whsec_" + base64 of the key.
	secretPrefix = "whsec_"
)

// ErrInvalidSignature is returned by Verify when no signature matches, and
// ErrTimestamp when the delivery is too old or too far in the future (a
// replay).
var (
	ErrInvalidSignature = errors.New("webhook: no valid signature")
	ErrTimestamp        = errors.New("webhook: timestamp outside the tolerance")
)

// VerifyTolerance is how far a delivery's timestamp may be from the
// receiver's clock.
const VerifyTolerance = 5 * time.Minute

// NewSecret returns a new random signing secret, "whsec_" and 32 bytes in
// base64.
func NewSecret() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand never fails on supported platforms
	return secretPrefix + base64.StdEncoding.EncodeToString(key)
}

// secretKey decodes a "whsec_<base64>" secret (the prefix is optional, as in
// the reference libraries).
func secretKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil || len(key) == 0 {
		return nil, fmt.Errorf("webhook: secret is not whsec_ followed by base64")
	}
	return key, nil
}

// sign returns "v1,<base64 HMAC-SHA256 of id.timestamp.body>".
func sign(key []byte, id string, ts int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(ts, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Sign returns the webhook-signature header value for secrets (each one
// entry, space-separated: a rotated endpoint signs with the old and the new
// secret during the grace period).
func Sign(secrets []string, id string, ts time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		key, err := secretKey(s)
		if err != nil {
			return "", err
		}
		sigs = append(sigs, sign(key, id, ts.Unix(), body))
	}
	return strings.Join(sigs, " "), nil
}

// Verify checks a delivery the way a Standard Webhooks receiver does: one of
// the v1 signatures in the webhook-signature header must be the HMAC of
// "id.timestamp.body" with secret, and the timestamp within VerifyTolerance
// of now. It returns ErrInvalidSignature or ErrTimestamp otherwise.
func Verify(secret string, headers http.Header, body []byte) error {
	return verifyAt(secret, headers, body, time.Now())
}

func verifyAt(secret string, headers http.Header, body []byte, now time.Time) error {
	key, err := secretKey(secret)
	if err != nil {
		return err
	}
	id, tsText, sigs := headers.Get(HeaderID), headers.Get(HeaderTimestamp), headers.Get(HeaderSignature)
	if id == "" || tsText == "" || sigs == "" {
		return fmt.Errorf("%w: missing %s, %s or %s", ErrInvalidSignature, HeaderID, HeaderTimestamp, HeaderSignature)
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q", ErrTimestamp, HeaderTimestamp, tsText)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > VerifyTolerance || d < -VerifyTolerance {
		return ErrTimestamp
	}
	want := sign(key, id, ts, body)
	for _, got := range strings.Fields(sigs) {
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
			return nil
		}
	}
	return ErrInvalidSignature
}
